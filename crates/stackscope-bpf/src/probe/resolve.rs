//! From a probe as written to what the kernel attaches to: the file a uprobe or USDT probe
//! names ([`super::probed_file`]), the function or USDT probe ([`super::usdt`]) in it, the
//! kernel function or tracepoint. Every miss is one line with the near matches.

use std::path::{Path, PathBuf};

use stackscope_symbols::elf::SymbolTable;

use super::near::{did_you_mean, near_matches};
use super::probed_file::{find_file, open_elf};
use super::usdt::usdt_sites;
use super::EventSpec;
use crate::error::BpfError;

/// A probe ready to attach.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Resolved {
    Uprobe {
        path: PathBuf,
        func: String,
        ret: bool,
    },
    Kprobe {
        func: String,
        ret: bool,
    },
    Tracepoint {
        category: String,
        name: String,
    },
    /// Each place the USDT probe sits in the file: file offsets of its address and of its
    /// semaphore (0: none).
    Usdt {
        path: PathBuf,
        sites: Vec<(u64, u64)>,
    },
}

/// Where tracefs is mounted, as libbpf looks for it.
const TRACEFS: [&str; 2] = ["/sys/kernel/tracing", "/sys/kernel/debug/tracing"];

/// Resolves a probe (not the timer). `pid` is a process of the target already running, whose
/// mapped libraries a library name is looked up in first.
pub(crate) fn resolve(spec: &EventSpec, pid: Option<u32>) -> Result<Resolved, BpfError> {
    let fail = |why: String| BpfError::Probe(format!("{spec}: {why}"));
    match spec {
        EventSpec::Timer { .. } => unreachable!("the timer is not a probe"),
        EventSpec::Uprobe { file, func, ret } => {
            let path = find_file(file, pid).map_err(fail)?;
            let names = function_names(&path).map_err(fail)?;
            if !names.iter().any(|n| n == func) {
                let near = near_matches(func, names.iter().map(String::as_str));
                return Err(fail(format!(
                    "no function {func} in {}{}",
                    path.display(),
                    did_you_mean(&near)
                )));
            }
            Ok(Resolved::Uprobe {
                path,
                func: func.clone(),
                ret: *ret,
            })
        }
        EventSpec::Kprobe { func, ret } => {
            if !kernel_has_kprobes() {
                return Err(fail(
                    "this kernel has no kprobes (built without CONFIG_KPROBES), so its functions cannot be probed; its tracepoints can (tracepoint:CATEGORY:NAME)".into(),
                ));
            }
            let names = kernel_functions().map_err(fail)?;
            if !names.iter().any(|n| n == func) {
                let near = near_matches(func, names.iter().map(String::as_str));
                return Err(fail(format!(
                    "no kernel function {func} in /proc/kallsyms{}",
                    did_you_mean(&near)
                )));
            }
            Ok(Resolved::Kprobe {
                func: func.clone(),
                ret: *ret,
            })
        }
        EventSpec::Tracepoint { category, name } => {
            check_tracepoint(category, name).map_err(fail)?;
            Ok(Resolved::Tracepoint {
                category: category.clone(),
                name: name.clone(),
            })
        }
        EventSpec::Usdt {
            file,
            provider,
            name,
        } => {
            let path = find_file(file, pid).map_err(fail)?;
            let sites = usdt_sites(&path, provider.as_deref(), name).map_err(fail)?;
            Ok(Resolved::Usdt { path, sites })
        }
    }
}

/// The names of the functions a file defines (symbol table and dynamic symbols), without
/// their symbol versions.
pub(super) fn function_names(path: &Path) -> Result<Vec<String>, String> {
    let elf = open_elf(path)?;
    let mut names: Vec<String> = [SymbolTable::Static, SymbolTable::Dynamic]
        .into_iter()
        .flat_map(|table| elf.defined_function_names(table).unwrap_or_default())
        .filter_map(|name| std::str::from_utf8(name).ok())
        .map(|n| n.split('@').next().unwrap_or(n).to_string())
        .collect();
    names.sort_unstable();
    names.dedup();
    Ok(names)
}

/// Whether kprobes can be made: the kprobe PMU (kernel 4.17+), or tracefs's kprobe_events
/// (what libbpf falls back to).
fn kernel_has_kprobes() -> bool {
    Path::new("/sys/bus/event_source/devices/kprobe").exists()
        || TRACEFS
            .iter()
            .any(|dir| Path::new(dir).join("kprobe_events").exists())
}

/// Text symbols of the running kernel and its modules.
fn kernel_functions() -> Result<Vec<String>, String> {
    let text = std::fs::read_to_string("/proc/kallsyms")
        .map_err(|e| format!("cannot read /proc/kallsyms: {e}"))?;
    let mut names: Vec<String> = text
        .lines()
        .filter_map(|line| {
            let mut fields = line.split_whitespace();
            let kind = fields.nth(1)?;
            let name = fields.next()?;
            matches!(kind, "t" | "T").then(|| name.to_string())
        })
        .collect();
    names.sort_unstable();
    names.dedup();
    Ok(names)
}

fn check_tracepoint(category: &str, name: &str) -> Result<(), String> {
    let Some(tracefs) = TRACEFS
        .iter()
        .map(Path::new)
        .find(|dir| dir.join("available_events").exists())
    else {
        return Err(
            "tracefs is not mounted, and tracepoints are found through it: mount -t tracefs nodev /sys/kernel/tracing"
                .into(),
        );
    };
    if tracefs
        .join("events")
        .join(category)
        .join(name)
        .join("id")
        .exists()
    {
        return Ok(());
    }
    let events = std::fs::read_to_string(tracefs.join("available_events")).unwrap_or_default();
    let wanted = format!("{category}:{name}");
    let near = near_matches(&wanted, events.lines());
    Err(format!(
        "no tracepoint {wanted} in {}/available_events{}",
        tracefs.display(),
        did_you_mean(&near)
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_libc_as_the_loader_does_and_names_near_functions() {
        let libc = find_file("libc", None).expect("libc in the loader's cache");
        assert!(
            libc.file_name()
                .unwrap()
                .to_string_lossy()
                .starts_with("libc.so"),
            "{}",
            libc.display()
        );
        let spec: EventSpec = "uprobe:libc:malloc".parse().unwrap();
        assert!(matches!(resolve(&spec, None), Ok(Resolved::Uprobe { .. })));
        // The running test maps libc too.
        let mapped = find_file("libc", Some(std::process::id())).unwrap();
        assert!(mapped.starts_with(format!("/proc/{}/root/", std::process::id())));

        let spec: EventSpec = "uprobe:libc:mallocc".parse().unwrap();
        let err = resolve(&spec, None).unwrap_err().to_string();
        assert!(err.contains("did you mean malloc"), "{err}");
        let spec: EventSpec = "uprobe:libcc_nothere:malloc".parse().unwrap();
        let err = resolve(&spec, None).unwrap_err().to_string();
        assert!(err.contains("no library libcc_nothere"), "{err}");
    }

    #[test]
    fn names_near_kernel_functions_or_the_missing_kprobes() {
        let spec: EventSpec = "kprobe:do_sys_openat".parse().unwrap();
        let err = resolve(&spec, None).unwrap_err().to_string();
        if kernel_has_kprobes() {
            assert!(err.contains("did you mean do_sys_openat2"), "{err}");
        } else {
            assert!(err.contains("CONFIG_KPROBES"), "{err}");
        }
        assert!(!err.contains('\n'));
        let spec: EventSpec = "tracepoint:syscalls:sys_enter_writ".parse().unwrap();
        let err = resolve(&spec, None).unwrap_err().to_string();
        assert!(
            err.contains("did you mean syscalls:sys_enter_write")
                || err.contains("tracefs is not mounted"),
            "{err}"
        );
    }
}
