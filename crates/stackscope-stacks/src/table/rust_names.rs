//! Short Rust function names, as the Asterinas OSDK prints them: generic arguments `<...>`
//! and compiler-made path segments (`::{impl#N}`, `::{closure#N}`, `::{{closure}}`) removed.

/// `alloc::boxed::{impl#50}::call<(), dyn Fn()>` becomes `alloc::boxed::call`. A name that
/// starts with a qualified path, `<T as Trait>::f`, keeps the type: `T::f`.
pub fn rust_clean(name: &str) -> String {
    let name = unqualify(name);
    let mut out = String::with_capacity(name.len());
    let mut angle = 0usize;
    for c in name.chars() {
        match c {
            '<' => angle += 1,
            '>' if angle > 0 => angle -= 1,
            _ if angle == 0 => out.push(c),
            _ => {}
        }
    }
    let out = remove_braced_segments(&out);
    if out.is_empty() {
        name.to_string()
    } else {
        out
    }
}

/// `<T as Trait>::rest` → `T::rest`; `<T>::rest` → `T::rest`.
fn unqualify(name: &str) -> String {
    let Some(inner_start) = name.strip_prefix('<') else {
        return name.to_string();
    };
    let mut depth = 1usize;
    for (i, c) in inner_start.char_indices() {
        match c {
            '<' => depth += 1,
            '>' => {
                depth -= 1;
                if depth == 0 {
                    let inner = &inner_start[..i];
                    let rest = &inner_start[i + 1..];
                    let ty = split_as(inner).unwrap_or(inner);
                    // `impl Trait for T` in legacy names.
                    let ty = ty.rsplit(" for ").next().unwrap_or(ty);
                    return format!("{}{rest}", unqualify(ty.trim()));
                }
            }
            _ => {}
        }
    }
    name.to_string()
}

/// The type of `T as Trait`, where ` as ` is outside any brackets.
fn split_as(inner: &str) -> Option<&str> {
    let mut depth = 0usize;
    for (i, c) in inner.char_indices() {
        match c {
            '<' | '(' | '[' => depth += 1,
            '>' | ')' | ']' => depth = depth.saturating_sub(1),
            ' ' if depth == 0 && inner[i..].starts_with(" as ") => return Some(&inner[..i]),
            _ => {}
        }
    }
    None
}

/// Removes `::{...}` segments (with nested braces).
fn remove_braced_segments(name: &str) -> String {
    let mut out = String::with_capacity(name.len());
    let mut rest = name;
    while let Some(at) = rest.find("::{") {
        out.push_str(&rest[..at]);
        let after = &rest[at + 2..];
        let mut depth = 0usize;
        let mut end = after.len();
        for (i, c) in after.char_indices() {
            match c {
                '{' => depth += 1,
                '}' => {
                    depth -= 1;
                    if depth == 0 {
                        end = i + 1;
                        break;
                    }
                }
                _ => {}
            }
        }
        rest = &after[end..];
    }
    out.push_str(rest);
    out
}

#[cfg(test)]
mod tests {
    use super::rust_clean;

    #[test]
    fn osdk_examples() {
        assert_eq!(
            rust_clean("aster_nix::sched::priority_scheduler::{impl#1}::local_mut_rq_with"),
            "aster_nix::sched::priority_scheduler::local_mut_rq_with"
        );
        assert_eq!(
            rust_clean("alloc::boxed::{impl#50}::call<(), (dyn core::ops::function::Fn<(), Output=()> + core::marker::Send), alloc::alloc::Global>"),
            "alloc::boxed::call"
        );
        assert_eq!(
            rust_clean("aster_nix::thread::kernel_thread::create_new_kernel_task::{closure#0}"),
            "aster_nix::thread::kernel_thread::create_new_kernel_task"
        );
        assert_eq!(
            rust_clean("ostd::sync::spin::SpinLock<T, G>::acquire_lock<T, G>"),
            "ostd::sync::spin::SpinLock::acquire_lock"
        );
    }

    #[test]
    fn legacy_demangled_names() {
        assert_eq!(
            rust_clean("<ostd::task::Task as core::ops::Drop>::drop"),
            "ostd::task::Task::drop"
        );
        assert_eq!(
            rust_clean("core::ops::function::FnOnce::call_once{{vtable.shim}}"),
            "core::ops::function::FnOnce::call_once{{vtable.shim}}"
        );
        assert_eq!(rust_clean("kmain::{{closure}}"), "kmain");
        assert_eq!(rust_clean("spin_a"), "spin_a");
    }
}
