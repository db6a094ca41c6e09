//! The naming step: every unique raw frame of a table named once, addresses batched per
//! module for the symbolizer, and interned in the profile being built.

use std::collections::{HashMap, HashSet};
use std::path::Path;

use stackscope_profile::{Frame, FrameId, FrameKind, ProfileBuilder, UNKNOWN};
use stackscope_symbols::{interrupt, SymFrame, Symbolizer};

use super::{rust_clean, ModuleId, ModuleKey, RawFrame, StackTable};

/// The frames each unique raw frame stands for, interned in the profile being built: a raw
/// frame costs two words here however long its names are. A live recording keeps one across
/// the tables it hands over ([`Names::extend`]), so that an address is named once, not once
/// per table.
#[derive(Default)]
pub(super) struct Names {
    /// Where each raw frame's frames are in `ids`, and how many (inlined functions make
    /// several).
    spans: HashMap<RawFrame, (u32, u32)>,
    ids: Vec<FrameId>,
    /// The raw frames of user code in a known module that no symbol names.
    unnamed: HashSet<RawFrame>,
    /// Of those, the ones in the function at the entry point their file states: a stripped
    /// program's `_start`.
    unnamed_entries: HashSet<RawFrame>,
    /// The modules some of whose addresses were named with a source line: debug info was
    /// found for them, in the file or a separate one.
    with_lines: HashSet<ModuleId>,
}

/// Addresses waiting for their symbolizer.
#[derive(Default)]
struct Queued {
    kernel: Vec<u64>,
    by_module: HashMap<ModuleId, Vec<u64>>,
    jit: HashMap<u32, Vec<u64>>,
}

impl Names {
    pub(super) fn resolve(
        table: &StackTable,
        symbolizer: &mut Symbolizer,
        builder: &mut ProfileBuilder,
    ) -> Names {
        let mut names = Names::default();
        names.extend(table, symbolizer, builder);
        names
    }

    /// Names the raw frames of `table` not named before. Its modules must number as those
    /// of the tables named before did ([`StackTable::take`] keeps them so).
    pub(super) fn extend(
        &mut self,
        table: &StackTable,
        symbolizer: &mut Symbolizer,
        builder: &mut ProfileBuilder,
    ) {
        let queued = self.queue(table, builder);
        self.name_kernel(&queued.kernel, symbolizer, builder);
        for (module, offsets) in queued.by_module {
            if interrupt::interrupted() {
                // Ctrl-C while naming: what is left keeps its module and address.
                self.name_by_address(table, module, &offsets, builder);
                continue;
            }
            self.name_module(table, module, &offsets, symbolizer, builder);
        }
        for (pid, addrs) in queued.jit {
            let jitdump = table.jitdumps.get(&pid).map(|path| Path::new(&**path));
            self.name_jit((pid, jitdump), &addrs, symbolizer, builder);
        }
    }

    /// Raw frames named so far: what this grows with.
    pub(super) fn len(&self) -> usize {
        self.spans.len()
    }

    /// Queues each unique address for its symbolizer, and names the raw frames that need no
    /// symbols.
    fn queue(&mut self, table: &StackTable, builder: &mut ProfileBuilder) -> Queued {
        let mut queued = Queued::default();
        for (_, raw) in &table.nodes {
            if self.spans.contains_key(raw) {
                continue;
            }
            let known = match *raw {
                RawFrame::Kernel(addr) => {
                    queued.kernel.push(addr);
                    None
                }
                RawFrame::User { module, offset } => {
                    queued.by_module.entry(module).or_default().push(offset);
                    None
                }
                RawFrame::Jit { pid, addr } => {
                    queued.jit.entry(pid).or_default().push(addr);
                    None
                }
                RawFrame::Unmapped(_) => Some(unknown(FrameKind::User, None)),
                RawFrame::UnmappedKernel(_) => Some(unknown(FrameKind::Kernel, None)),
                RawFrame::Truncated => Some(Frame::marker("[truncated]")),
                RawFrame::Marker(name) | RawFrame::Event(name) => Some(Frame::marker(name)),
            };
            // A placeholder keeps each address queued once.
            self.spans.insert(*raw, (0, 0));
            if let Some(frame) = known {
                self.insert(builder, *raw, [frame]);
            }
        }
        queued
    }

    fn name_kernel(
        &mut self,
        kernel: &[u64],
        symbolizer: &mut Symbolizer,
        builder: &mut ProfileBuilder,
    ) {
        let kernel_names = symbolizer.symbolize_kernel(kernel);
        for (addr, sym) in kernel.iter().zip(kernel_names) {
            let frame = match sym {
                Some(sym) => frame_from(sym, FrameKind::Kernel, Some("[kernel.kallsyms]")),
                None => unknown(FrameKind::Kernel, Some("[kernel.kallsyms]")),
            };
            self.insert(builder, RawFrame::Kernel(*addr), [frame]);
        }
    }

    /// Names the addresses of one module, as offsets in its file (RVAs in a PE image, which
    /// the symbolizer names from its PDB or DWARF), in one batch. An address no
    /// symbol names is named by the module and the start of its function
    /// ([`address_name`]).
    fn name_module(
        &mut self,
        table: &StackTable,
        module: ModuleId,
        offsets: &[u64],
        symbolizer: &mut Symbolizer,
        builder: &mut ProfileBuilder,
    ) {
        let (module_name, kind, path, resolved) = match &table.modules[module as usize] {
            ModuleKey::Vdso => (
                "[vdso]".to_string(),
                FrameKind::User,
                None,
                symbolizer.symbolize_vdso(offsets),
            ),
            ModuleKey::File {
                path,
                build_id,
                kind,
            } => {
                let resolved = symbolizer
                    .symbolize_file(Path::new(&**path), build_id.as_deref(), offsets)
                    .unwrap_or_else(|_| vec![Vec::new(); offsets.len()]);
                (file_name(path), *kind, Some(path), resolved)
            }
        };
        if interrupt::interrupted() {
            // Interrupted while this module was named: its names are partial at best.
            self.name_by_address(table, module, offsets, builder);
            return;
        }
        let naming = table.naming;
        let mut unnamed = Vec::new();
        for (offset, syms) in offsets.iter().zip(resolved) {
            let raw = RawFrame::User {
                module,
                offset: *offset,
            };
            if syms.is_empty() {
                unnamed.push(*offset);
            } else {
                if syms.iter().any(|s| s.line.is_some()) {
                    self.with_lines.insert(module);
                }
                let frames = syms.into_iter().map(|mut s| {
                    if naming.short_rust_names {
                        s.name = rust_clean(&s.name);
                    }
                    frame_from(s, kind, Some(&module_name))
                });
                self.insert(builder, raw, frames);
            }
        }
        let (starts, entry) = match path {
            Some(path) => (
                symbolizer.function_starts(Path::new(&**path), &unnamed),
                symbolizer.entry_point(Path::new(&**path)),
            ),
            None => (unnamed.clone(), None),
        };
        let shown = (module_name.as_str(), kind);
        self.name_unnamed(module, shown, &unnamed, &starts, entry, builder);
    }

    /// Names `offsets` of `module` by the module and the offset alone, reading no file: what
    /// is left when naming was interrupted.
    fn name_by_address(
        &mut self,
        table: &StackTable,
        module: ModuleId,
        offsets: &[u64],
        builder: &mut ProfileBuilder,
    ) {
        let (module_name, kind) = match &table.modules[module as usize] {
            ModuleKey::Vdso => ("[vdso]".to_string(), FrameKind::User),
            ModuleKey::File { path, kind, .. } => (file_name(path), *kind),
        };
        self.name_unnamed(
            module,
            (&module_name, kind),
            offsets,
            offsets,
            None,
            builder,
        );
    }

    /// Names each of `offsets` of `module` (shown as `module_name`, its frames of `kind`),
    /// which no symbol names, by the module and the start of its function (`starts`, one for
    /// each), noting the ones in its file's `entry` function.
    fn name_unnamed(
        &mut self,
        module: ModuleId,
        (module_name, kind): (&str, FrameKind),
        offsets: &[u64],
        starts: &[u64],
        entry: Option<u64>,
        builder: &mut ProfileBuilder,
    ) {
        for (&offset, &start) in offsets.iter().zip(starts) {
            let raw = RawFrame::User { module, offset };
            let frame = Frame {
                name: address_name(module_name, start),
                module: Some(module_name.to_string()),
                kind,
                ..Frame::default()
            };
            self.insert(builder, raw, [frame]);
            if kind == FrameKind::User {
                self.unnamed.insert(raw);
                if entry == Some(start) {
                    self.unnamed_entries.insert(raw);
                }
            }
        }
    }

    /// Names JIT code of `pid` from the jitdump it mapped (if any) and its perf map.
    fn name_jit(
        &mut self,
        (pid, jitdump): (u32, Option<&Path>),
        addrs: &[u64],
        symbolizer: &mut Symbolizer,
        builder: &mut ProfileBuilder,
    ) {
        let resolved = symbolizer.symbolize_jit(pid, jitdump, addrs);
        for (addr, sym) in addrs.iter().zip(resolved) {
            let frame = match sym {
                Some(sym) => frame_from(sym, FrameKind::User, Some("[jit]")),
                None => unknown(FrameKind::User, None),
            };
            self.insert(builder, RawFrame::Jit { pid, addr: *addr }, [frame]);
        }
    }

    /// Interns `frames` (outermost first) as what `raw` stands for.
    fn insert(
        &mut self,
        builder: &mut ProfileBuilder,
        raw: RawFrame,
        frames: impl IntoIterator<Item = Frame>,
    ) {
        let start = self.ids.len();
        self.ids
            .extend(frames.into_iter().map(|f| builder.frame(f)));
        let span = (start as u32, (self.ids.len() - start) as u32);
        self.spans.insert(raw, span);
    }

    /// Whether `raw` is user code of a known module that no symbol names.
    pub(super) fn is_unnamed(&self, raw: &RawFrame) -> bool {
        self.unnamed.contains(raw)
    }

    /// Whether some address of `module` was named with a source line.
    pub(super) fn has_lines(&self, module: ModuleId) -> bool {
        self.with_lines.contains(&module)
    }

    /// Whether `raw` is user code no symbol names in the function at its file's entry point.
    pub(super) fn is_unnamed_entry(&self, raw: &RawFrame) -> bool {
        self.unnamed_entries.contains(raw)
    }

    pub(super) fn frames(&self, raw: &RawFrame) -> &[FrameId] {
        match self.spans.get(raw) {
            Some(&(start, len)) => &self.ids[start as usize..(start + len) as usize],
            None => &[],
        }
    }
}

fn frame_from(sym: SymFrame, kind: FrameKind, module: Option<&str>) -> Frame {
    Frame {
        name: sym.name,
        module: module.map(str::to_string),
        file: sym.file,
        line: sym.line,
        inlined: sym.inlined,
        kind,
    }
}

fn unknown(kind: FrameKind, module: Option<&str>) -> Frame {
    Frame {
        name: UNKNOWN.to_string(),
        module: module.map(str::to_string),
        kind,
        ..Frame::default()
    }
}

/// The name of code in `module` that no symbol names: the module's file name and the address
/// its function starts at, as `perf report` shows such code (`liblzma.so.5+0x1f3a0`).
fn address_name(module: &str, address: u64) -> String {
    format!("{module}+{address:#x}")
}

/// The last path component: `libc.so.6` for `/usr/lib/x86_64-linux-gnu/libc.so.6`, `ntdll.dll`
/// for `C:\Windows\System32\ntdll.dll`; for a copy
/// in perf's build-id cache (`.debug/ORIGINAL/PATH/BUILDID/elf`), the original file's name.
pub(super) fn file_name(path: &str) -> String {
    let original = original_path(path);
    original
        .rsplit(['/', '\\'])
        .next()
        .unwrap_or(original)
        .to_string()
}

/// The path of the file a copy in perf's build-id cache (`.debug/ORIGINAL/PATH/BUILDID/elf`)
/// was taken from: `/usr/bin/xz` for `/root/.debug/usr/bin/xz/6fab...ce9/elf`, `/[vdso]` for a
/// vDSO's (`.debug/[vdso]/BUILDID/vdso`); any other path as it is.
pub(crate) fn original_path(path: &str) -> &str {
    let cached = path
        .find("/.debug/")
        // The cache keeps the original's whole path, its leading slash included.
        .map(|at| &path[at + "/.debug".len()..])
        .and_then(|rest| {
            rest.strip_suffix("/elf").or_else(|| {
                rest.strip_suffix("/vdso")
                    .filter(|r| r.starts_with("/[vdso]/"))
            })
        })
        .and_then(|rest| rest.rsplit_once('/'))
        .filter(|(original, id)| {
            original.len() > 1 && id.len() >= 16 && id.bytes().all(|b| b.is_ascii_hexdigit())
        });
    match cached {
        Some((original, _)) => original,
        None => path,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn module_names_see_through_perfs_build_id_cache() {
        assert_eq!(
            file_name("/usr/lib/x86_64-linux-gnu/libc.so.6"),
            "libc.so.6"
        );
        assert_eq!(
            file_name("/root/.debug/tmp/x/prog/6fab166e78b0a2a73797d7e2c63a5a0fa27d0ce9/elf"),
            "prog"
        );
        assert_eq!(file_name("/opt/tools/elf"), "elf");
        assert_eq!(
            file_name("/root/.debug/[vdso]/71727bea18c7691dd1bf0705aaadd3f9da34d39d/vdso"),
            "[vdso]"
        );
        assert_eq!(file_name("/opt/tools/vdso"), "vdso");
        assert_eq!(
            original_path("/root/.debug/usr/bin/xz/6fab166e78b0a2a73797d7e2c63a5a0fa27d0ce9/elf"),
            "/usr/bin/xz"
        );
        assert_eq!(
            original_path("/home/me/.debug/notes/elf"),
            "/home/me/.debug/notes/elf"
        );
        assert_eq!(file_name(r"C:\Windows\System32\ntdll.dll"), "ntdll.dll");
    }

    #[test]
    fn a_guest_kernels_frames_stay_kernel_code() {
        use crate::table::{Naming, Sampled};
        use crate::walk::WalkEnd;
        use crate::Mapping;
        use stackscope_profile::{Metadata, Thread};

        let kernel = Mapping {
            start: 0xffff_ffff_8000_0000,
            end: 0xffff_ffff_8100_0000,
            offset: 0x1000,
            path: "/nonexistent/guest-kernel.elf".into(),
            build_id: None,
        };
        let thread = |pid, tid| Thread {
            pid,
            tid,
            ..Thread::default()
        };
        let mut table = StackTable::default();
        table.set_naming(Naming {
            short_rust_names: true,
        });
        let inside = kernel.start + 0x10;
        let frames = [
            table.frame_in(1, inside, Some(&kernel), FrameKind::Kernel),
            table.frame_in(1, kernel.end + 0x10, None, FrameKind::Kernel),
            table.frame_in(1, 0x1000, None, FrameKind::User),
        ];
        let sampled = Sampled {
            pid: 1,
            tid: 0,
            cpu: 0,
            names: None,
        };
        table.count(sampled, &frames, WalkEnd::Complete, 1);
        let (profile, tally) =
            table.into_profile(&mut Symbolizer::new(), Metadata::default(), &thread);
        let mut named: Vec<(&str, Option<&str>, FrameKind)> = profile
            .frames
            .iter()
            .map(|f| (f.name.as_str(), f.module.as_deref(), f.kind))
            .collect();
        named.sort_by_key(|f| (f.1, f.2 == FrameKind::User));
        // Addresses in no module are unknown; one in a module whose file cannot be read is
        // named by the module and its file offset.
        let mut expected = vec![
            (UNKNOWN, None, FrameKind::Kernel),
            (UNKNOWN, None, FrameKind::User),
            (
                "guest-kernel.elf+0x1010",
                Some("guest-kernel.elf"),
                FrameKind::Kernel,
            ),
        ];
        expected.sort_by_key(|f| (f.1, f.2 == FrameKind::User));
        assert_eq!(named, expected);
        assert_eq!(tally.stats.with_unknown, 1);
        assert_eq!(
            tally.stats.with_unnamed, 0,
            "kernel frames are not user code"
        );
    }
}
