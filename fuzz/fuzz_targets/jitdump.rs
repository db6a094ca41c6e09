//! The jitdump reader (`jit-PID.dump`, which any JIT writes) on any bytes: no panic, no hang.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    stackscope_symbols::fuzzing::jitdump(data);
});
