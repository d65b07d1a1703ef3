// Catch2 v2 main (v3 links Catch2::Catch2WithMain instead).
#define CATCH_CONFIG_MAIN
#include <catch2/catch.hpp>
