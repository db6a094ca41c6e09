//! The perf map reader (`/tmp/perf-PID.map`, which any JIT writes) on any text: no panic, no
//! hang.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    stackscope_symbols::fuzzing::perf_map(&String::from_utf8_lossy(data));
});
