//! The one ELF reader on any bytes: headers, build-id, debug link, function symbols. A file
//! any user can leave where a binary or a debug file is looked for.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    stackscope_symbols::fuzzing::elf(data);
});
