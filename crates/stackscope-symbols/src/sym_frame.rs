//! One named frame ([`SymFrame`]) as every source of names makes it (blazesym's ELF and
//! kernel lookups, a PDB, perf maps): its name demangled when it is still mangled and shown
//! without a Rust legacy hash, its line only where the line table gives a real one.

use crate::demangle::demangle;

/// One named frame for one address. An address inside inlined code gives several.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SymFrame {
    /// Demangled name (Rust legacy without the `::h<hash>` suffix, Rust v0, C++).
    pub name: String,
    /// Source file path, when debug info has it.
    pub file: Option<String>,
    /// Source line, when debug info has it.
    pub line: Option<u32>,
    /// True for every frame but the outermost real function.
    pub inlined: bool,
}

/// One frame as every source gives it: `name` demangled if it is still mangled (blazesym
/// has demangled its own) and without a Rust legacy hash, `[unknown]` for no name. Line 0
/// marks compiler-generated code with no source position; its file is whatever the line
/// table last named, so a frame without a line has no file either.
pub(crate) fn sym_frame(
    name: &str,
    file: Option<String>,
    line: Option<u32>,
    inlined: bool,
) -> SymFrame {
    let (file, line) = match line {
        Some(line) if line > 0 => (file, Some(line)),
        _ => (None, None),
    };
    SymFrame {
        name: display_name(&demangle(name)),
        file,
        line,
        inlined,
    }
}

/// A name as frames show it: `[unknown]` for none, a Rust legacy hash left out.
pub(crate) fn display_name(name: &str) -> String {
    if name.is_empty() {
        return "[unknown]".to_string();
    }
    strip_rust_hash(name).to_string()
}

/// Drops the `::h0123456789abcdef` disambiguator that Rust legacy mangling appends. blazesym
/// already omits it when it demangles; this catches names that arrive demangled with the hash
/// (perf maps, some DWARF producers).
pub(crate) fn strip_rust_hash(name: &str) -> &str {
    if let Some(pos) = name.len().checked_sub(19) {
        if let Some(hash) = name.get(pos..) {
            if hash.starts_with("::h") && hash[3..].bytes().all(|b| b.is_ascii_hexdigit()) {
                return &name[..pos];
            }
        }
    }
    name
}

#[cfg(test)]
mod tests {
    use super::strip_rust_hash;

    #[test]
    fn strips_legacy_hash_only() {
        assert_eq!(
            strip_rust_hash("core::fmt::write::h0123456789abcdef"),
            "core::fmt::write"
        );
        assert_eq!(strip_rust_hash("core::fmt::write"), "core::fmt::write");
        assert_eq!(
            strip_rust_hash("a::h0123456789abcdeg"),
            "a::h0123456789abcdeg"
        );
        assert_eq!(strip_rust_hash("h0123456789abcdef"), "h0123456789abcdef");
    }
}
