/* The attention config's fields, stated once: name and kind of each, in rtattn_config's order (rtattn.h). The C
 * struct, the C++ AttentionConfig (rtattn/config.hpp and the library's own), their converters, the canonical JSON
 * and the Python binding follow this list; the tests check that each agrees with it.
 *
 * RTATTN_CONFIG_FIELDS(X) calls X(name, kind) for each field. Kinds, as C (rtattn_config) / C++ / JSON:
 *   INT         int32_t                         / int                   / integer
 *   OPT_INT     int32_t has_<name>, int32_t     / std::optional<int>    / integer or null
 *   DTYPE       int32_t RTATTN_FP16/RTATTN_BF16 / Dtype                 / "fp16" or "bf16"
 *   FLAG        int32_t 0 or 1                  / bool                  / true or false
 *   OPT_DOUBLE  int32_t has_<name>, double      / std::optional<double> / number or null
 *   STRING      const char*                     / std::string           / string
 * A field of an existing kind is one line here and its member in each struct; describe() and the CLI's flags keep
 * their own spellings. */
#ifndef RTATTN_CONFIG_FIELDS_H
#define RTATTN_CONFIG_FIELDS_H

#define RTATTN_CONFIG_FIELDS(X)     \
    X(head_dim_qk, INT)             \
    X(head_dim_v, OPT_INT)          \
    X(dtype, DTYPE)                 \
    X(causal, FLAG)                 \
    X(num_heads_q, INT)             \
    X(num_heads_kv, INT)            \
    X(softmax_scale, OPT_DOUBLE)    \
    X(arch, STRING)                 \
    X(decode, FLAG)                 \
    X(paged_kv, FLAG)               \
    X(varlen, FLAG)                 \
    X(local, FLAG)                  \
    X(sinks, FLAG)                  \
    X(softcap, FLAG)                \
    X(alibi, FLAG)

#endif
