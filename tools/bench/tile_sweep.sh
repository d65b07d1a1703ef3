#!/usr/bin/env bash
# Times plan-table candidates: for each head dim, each RTATTN_TILE variant (block_m,block_n,warps,m_tiles,stages,
# q_in_regs) at S=16k, causal and not. Usage: tile_sweep.sh RTATTN_BIN "d:tile tile ..." ...
# e.g. tile_sweep.sh build/tools/rtattn "128:128,64,8,1,2,1 128,32,4,2,3,0" "256:64,64,4,1,2,0"
set -u
bin=$1
shift
for spec in "$@"; do
  d=${spec%%:*}
  for tile in ${spec#*:}; do
    RTATTN_TILE=$tile "$bin" bench --head-dim "$d" --seqlens "${SEQ:-16384}" --reps 20 2>&1 |
      awk -v t="$tile" 'NR > 2 { print t, $0 }'
  done
done
