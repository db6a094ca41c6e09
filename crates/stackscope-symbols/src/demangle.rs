//! Demangling of names that arrive mangled from a source that does not demangle them itself
//! (a PDB's public symbols): MSVC-decorated C++ names (`?compute@Widget@shapes@@QEBAHH@Z`),
//! Rust v0 and legacy names, and Itanium C++ names, with the crates blazesym demangles
//! ELF names with, so that one function is named alike whatever file named it.

use std::borrow::Cow;

use msvc_demangler::DemangleFlags;

/// `name` demangled when it is a mangled name of a scheme above, else as it is.
pub(crate) fn demangle(name: &str) -> Cow<'_, str> {
    let demangled = if name.starts_with('?') {
        msvc(name)
    } else if let Ok(rust) = rustc_demangle::try_demangle(name) {
        // `#` leaves the legacy hash out.
        Some(format!("{rust:#}"))
    } else if name.starts_with("_Z") {
        cpp_demangle::Symbol::new(name)
            .ok()
            .and_then(|symbol| symbol.demangle().ok())
    } else {
        None
    };
    demangled.map_or(Cow::Borrowed(name), Cow::Owned)
}

/// An MSVC-decorated name as the function's qualified name and argument types, as the
/// Itanium demangler gives a C++ function (`shapes::Widget::compute(int) const`): without
/// return type, access, calling convention, storage class or `class`/`struct` keywords.
fn msvc(name: &str) -> Option<String> {
    let flags = DemangleFlags::NO_FUNCTION_RETURNS
        | DemangleFlags::NO_ACCESS_SPECIFIERS
        | DemangleFlags::NO_MEMBER_TYPE
        | DemangleFlags::NO_MS_KEYWORDS
        | DemangleFlags::NO_CLASS_TYPE
        | DemangleFlags::SPACE_AFTER_COMMA;
    msvc_demangler::demangle(name, flags).ok()
}

#[cfg(test)]
mod tests {
    use super::demangle;

    #[test]
    fn each_scheme_and_plain_names() {
        assert_eq!(demangle("?work@@YAHH@Z"), "work(int)");
        assert_eq!(
            demangle("_ZN4core3fmt5write17h0123456789abcdefE"),
            "core::fmt::write"
        );
        assert_eq!(demangle("_RNvCs1234_7mycrate3foo"), "mycrate::foo");
        assert_eq!(
            demangle("_ZN6shapes6Widget4sizeEv"),
            "shapes::Widget::size()"
        );
        assert_eq!(demangle("mainCRTStartup"), "mainCRTStartup");
        // Not valid in any scheme: left alone rather than dropped.
        assert_eq!(demangle("?not@valid"), "?not@valid");
    }
}
