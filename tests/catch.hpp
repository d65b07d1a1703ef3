// One include for Catch2 v2 (Debian 12) and v3 (the GPU image).
#pragma once
#if __has_include(<catch2/catch_test_macros.hpp>)
#include <catch2/catch_approx.hpp>
#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>
#define RTATTN_CATCH3 1
using Catch::Approx;
#else
#include <catch2/catch.hpp>
#endif

// GPU tests without a GPU: a visible skip (Catch2 v3 counts it as skipped; v2 prints a warning and passes).
#ifdef RTATTN_CATCH3
#define RTATTN_SKIP(msg) SKIP(msg)
#else
#define RTATTN_SKIP(msg)            \
    do {                            \
        WARN("SKIPPED: " << msg);   \
        return;                     \
    } while (0)
#endif
