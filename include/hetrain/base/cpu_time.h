// CPU time consumed, as the kernel counts it: what benchmarks and logs set beside wall time.
#pragma once

namespace hetrain {

/// CPU seconds used by the whole process so far (all threads, user + system).
double process_cpu_seconds();
/// CPU seconds used by the calling thread so far.
double thread_cpu_seconds();
/// Wall seconds on a monotonic clock (from an arbitrary origin): the time beside which the two
/// above are set.
double monotonic_seconds();

}  // namespace hetrain
