//! From a probe as written to what the kernel attaches to: the file a uprobe or USDT probe
//! names (a path, a library as the dynamic loader finds it, or a program in PATH), the
//! function or USDT note in it, the kernel function or tracepoint. Every miss is one line
//! with the near matches.

use std::path::{Path, PathBuf};

use object::{Object, ObjectSegment, ObjectSymbol, SymbolKind};
use stackscope_symbols::foreign::{self, Kind};

use super::near::{did_you_mean, near_matches};
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

/// The file a probe names: a path as given; a name without '/' as a library the target has
/// mapped, else as the dynamic loader's cache finds it, else as a program in PATH.
fn find_file(file: &str, pid: Option<u32>) -> Result<PathBuf, String> {
    if file.contains('/') {
        let path = Path::new(file);
        return match std::fs::metadata(path) {
            Ok(m) if m.is_file() => Ok(path.canonicalize().unwrap_or_else(|_| path.into())),
            Ok(_) => Err(format!("{file} is not a file")),
            Err(e) => Err(format!("cannot open {file}: {e}")),
        };
    }
    let is_library = |base: &str| {
        [format!("{file}.so"), format!("lib{file}.so")]
            .iter()
            .any(|prefix| base.starts_with(prefix.as_str()))
    };
    if let Some(pid) = pid {
        if let Some(path) = mapped_library(pid, &is_library) {
            return Ok(path);
        }
    }
    let cache = loader_cache();
    if let Some((_, path)) = cache.iter().find(|(name, _)| is_library(name)) {
        return Ok(path.clone());
    }
    if let Some(path) = in_path(file) {
        return Ok(path);
    }
    let near = near_matches(
        file,
        cache
            .iter()
            .map(|(name, _)| name.split(".so").next().unwrap_or(name)),
    );
    Err(format!(
        "no library {file} in the dynamic loader's cache (/etc/ld.so.cache) nor program {file} in PATH{}",
        did_you_mean(&near)
    ))
}

/// The first file the process maps whose name `wanted` accepts.
fn mapped_library(pid: u32, wanted: &dyn Fn(&str) -> bool) -> Option<PathBuf> {
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).ok()?;
    maps.lines()
        .filter_map(|line| line.split_whitespace().nth(5))
        .filter(|path| path.starts_with('/'))
        .find(|path| path.rsplit('/').next().is_some_and(wanted))
        .map(|path| Path::new(&format!("/proc/{pid}/root{path}")).to_path_buf())
}

/// The dynamic loader's cache (glibc's ld.so.cache, new format): (soname, path) of the
/// libraries of this machine's word size, in the cache's order (the loader's preference).
fn loader_cache() -> Vec<(String, PathBuf)> {
    const MAGIC: &[u8] = b"glibc-ld.so.cache1.1";
    const HEADER: usize = 48;
    const ENTRY: usize = 24;
    // Flags of an x86-64 libc6 library (FLAG_X8664_LIB64 | FLAG_ELF_LIBC6).
    const X86_64_LIBC6: u32 = 0x0303;
    let Ok(bytes) = std::fs::read("/etc/ld.so.cache") else {
        return Vec::new();
    };
    let Some(start) = bytes.windows(MAGIC.len()).position(|w| w == MAGIC) else {
        return Vec::new();
    };
    let cache = &bytes[start..];
    let u32_at = |at: usize| -> Option<u32> {
        Some(u32::from_ne_bytes(cache.get(at..at + 4)?.try_into().ok()?))
    };
    // Strings are offsets from the start of the new-format cache.
    let string_at = |at: u32| -> Option<String> {
        let tail = cache.get(at as usize..)?;
        let end = tail.iter().position(|&b| b == 0)?;
        Some(String::from_utf8_lossy(&tail[..end]).into_owned())
    };
    let count = u32_at(20).unwrap_or(0) as usize;
    (0..count)
        .filter_map(|i| {
            let at = HEADER + i * ENTRY;
            let flags = u32_at(at)?;
            (flags & 0xffff == X86_64_LIBC6).then_some(())?;
            let name = string_at(u32_at(at + 4)?)?;
            let path = string_at(u32_at(at + 8)?)?;
            Some((name, PathBuf::from(path)))
        })
        .collect()
}

fn in_path(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|dir| dir.join(name))
        .find(|p| p.is_file())
}

/// The names of the functions a file defines (symbol table and dynamic symbols).
fn function_names(path: &Path) -> Result<Vec<String>, String> {
    let bytes = foreign::read(path, Kind::Binary)
        .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    let file = object::File::parse(&*bytes)
        .map_err(|e| format!("{} is not an ELF file: {e}", path.display()))?;
    let mut names: Vec<String> = file
        .symbols()
        .chain(file.dynamic_symbols())
        .filter(|s| s.kind() == SymbolKind::Text && s.is_definition())
        .filter_map(|s| s.name().ok())
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

/// A USDT probe's places in a file, from its `.note.stapsdt` notes (SystemTap's SDT format:
/// the probe's address, the link-time address of `.stapsdt.base`, the semaphore's address,
/// then provider, name and argument spec as strings), as file offsets.
fn usdt_sites(path: &Path, provider: Option<&str>, name: &str) -> Result<Vec<(u64, u64)>, String> {
    let bytes = foreign::read(path, Kind::Binary)
        .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    let file = object::File::parse(&*bytes)
        .map_err(|e| format!("{} is not an ELF file: {e}", path.display()))?;
    let notes = file
        .section_by_name(".note.stapsdt")
        .and_then(|s| object::ObjectSection::data(&s).ok())
        .unwrap_or_default();
    // Where .stapsdt.base is now, against where each note says it was linked (prelink).
    let base = file
        .section_by_name(".stapsdt.base")
        .map(|s| object::ObjectSection::address(&s));
    let to_offset = |addr: u64| {
        file.segments().find_map(|seg| {
            let (offset, size) = seg.file_range();
            (addr >= seg.address() && addr < seg.address() + size)
                .then(|| addr - seg.address() + offset)
        })
    };
    let mut sites = Vec::new();
    let mut seen = Vec::new();
    for note in sdt_notes(notes) {
        let adjust = |addr: u64| match base {
            Some(now) if addr != 0 => addr.wrapping_add(now).wrapping_sub(note.base),
            _ => addr,
        };
        // Near matches in the spelling asked for: with or without the provider.
        seen.push(match provider {
            Some(_) => format!("{}:{}", note.provider, note.name),
            None => note.name.clone(),
        });
        if note.name != name || provider.is_some_and(|p| p != note.provider) {
            continue;
        }
        let Some(pc) = to_offset(adjust(note.pc)) else {
            continue;
        };
        let semaphore = match note.semaphore {
            0 => 0,
            addr => to_offset(adjust(addr)).unwrap_or(0),
        };
        sites.push((pc, semaphore));
    }
    if sites.is_empty() {
        let wanted = match provider {
            Some(p) => format!("{p}:{name}"),
            None => name.to_string(),
        };
        seen.sort();
        seen.dedup();
        let near = near_matches(&wanted, seen.iter().map(String::as_str));
        let none = if seen.is_empty() {
            " (it has no USDT probes)"
        } else {
            ""
        };
        return Err(format!(
            "no USDT probe {wanted} in {}{none}{}",
            path.display(),
            did_you_mean(&near)
        ));
    }
    Ok(sites)
}

struct SdtNote {
    pc: u64,
    base: u64,
    semaphore: u64,
    provider: String,
    name: String,
}

/// The stapsdt notes (type 3, owner "stapsdt") of a note section, 64-bit ones.
fn sdt_notes(mut data: &[u8]) -> Vec<SdtNote> {
    let word = |b: &[u8], at: usize| -> Option<u32> {
        Some(u32::from_ne_bytes(b.get(at..at + 4)?.try_into().ok()?))
    };
    let align = |n: usize| (n + 3) & !3;
    let mut notes = Vec::new();
    while let (Some(namesz), Some(descsz), Some(kind)) =
        (word(data, 0), word(data, 4), word(data, 8))
    {
        let (namesz, descsz) = (namesz as usize, descsz as usize);
        let desc_at = 12 + align(namesz);
        let Some(desc) = data.get(desc_at..desc_at + descsz) else {
            break;
        };
        if kind == 3 && data.get(12..12 + namesz) == Some(&b"stapsdt\0"[..]) && desc.len() > 24 {
            let addr = |i: usize| u64::from_ne_bytes(desc[i * 8..i * 8 + 8].try_into().unwrap());
            let mut strings = desc[24..].split(|&b| b == 0).map(String::from_utf8_lossy);
            if let (Some(provider), Some(name)) = (strings.next(), strings.next()) {
                notes.push(SdtNote {
                    pc: addr(0),
                    base: addr(1),
                    semaphore: addr(2),
                    provider: provider.into_owned(),
                    name: name.into_owned(),
                });
            }
        }
        data = data.get(desc_at + align(descsz)..).unwrap_or_default();
    }
    notes
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
