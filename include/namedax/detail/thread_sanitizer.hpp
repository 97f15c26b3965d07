// SPDX-License-Identifier: MIT
// NAMEDAX_THREAD_SANITIZER: defined when compiled with ThreadSanitizer, which cannot see
// oneTBB's (uninstrumented) hand-off of a task to a worker and would report every task as a
// race. Under it, device threads are std::threads and work meant for tbb runs in turn.
// IWYU pragma: private, include <namedax/namedax.hpp>
#pragma once

#if defined(__SANITIZE_THREAD__)
#define NAMEDAX_THREAD_SANITIZER 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define NAMEDAX_THREAD_SANITIZER 1
#endif
#endif
