// Catch2 main for the transport unit tests.

// GCC 12 with -fsanitize=address at -O2 warns of a maybe-uninitialized std::function inside
// libstdc++'s <regex>, which Catch's main instantiates; the warning is about library code.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

#define CATCH_CONFIG_MAIN
#include <catch2/catch.hpp>
