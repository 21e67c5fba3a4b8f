// Internal invariants. A broken invariant is a bug in affinity, not bad input:
// abort with file:line. Bad input must be reported through aff::Status instead.
#pragma once

#include <cstdio>
#include <cstdlib>

#define AFF_CHECK(cond)                                                              \
  do {                                                                               \
    if (!(cond)) {                                                                   \
      std::fprintf(stderr, "affinity: internal check failed at %s:%d: %s\n", __FILE__, \
                   __LINE__, #cond);                                                 \
      std::abort();                                                                  \
    }                                                                                \
  } while (0)

#define AFF_CHECK_EQ(a, b) AFF_CHECK((a) == (b))
#define AFF_CHECK_LT(a, b) AFF_CHECK((a) < (b))
#define AFF_CHECK_LE(a, b) AFF_CHECK((a) <= (b))
