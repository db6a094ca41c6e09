//! Turns code addresses into named frames: functions in ELF files (with inlined functions and
//! demangled names, separate debug files found by build-id), kernel functions from
//! `/proc/kallsyms`, and JIT code from `/tmp/perf-PID.map`. Addresses are resolved in batches,
//! each unique address once.
