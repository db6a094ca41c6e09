//! The naming step: every unique raw frame of a table named once, addresses batched per
//! module for the symbolizer, and interned in the profile being built.

use std::collections::HashMap;
use std::path::Path;

use stackscope_profile::{Frame, FrameId, FrameKind, ProfileBuilder, UNKNOWN};
use stackscope_symbols::{SymFrame, Symbolizer};

use super::{ModuleId, ModuleKey, RawFrame, StackTable};

/// The frames each unique raw frame stands for, interned in the profile being built: a raw
/// frame costs two words here however long its names are.
pub(super) struct Names {
    /// Where each raw frame's frames are in `ids`, and how many (inlined functions make
    /// several).
    spans: HashMap<RawFrame, (u32, u32)>,
    ids: Vec<FrameId>,
}

impl Names {
    pub(super) fn resolve(
        table: &StackTable,
        symbolizer: &mut Symbolizer,
        builder: &mut ProfileBuilder,
    ) -> Names {
        let mut names = Names {
            spans: HashMap::new(),
            ids: Vec::new(),
        };
        let mut by_module: HashMap<ModuleId, Vec<u64>> = HashMap::new();
        let mut kernel = Vec::new();
        let mut jit: HashMap<u32, Vec<u64>> = HashMap::new();
        for (_, raw) in &table.nodes {
            if names.spans.contains_key(raw) {
                continue;
            }
            // Addresses are queued for their symbolizer and named below; the rest need no
            // symbols.
            let known = match *raw {
                RawFrame::Kernel(addr) => {
                    kernel.push(addr);
                    None
                }
                RawFrame::User { module, offset } => {
                    by_module.entry(module).or_default().push(offset);
                    None
                }
                RawFrame::Jit { pid, addr } => {
                    jit.entry(pid).or_default().push(addr);
                    None
                }
                RawFrame::Unmapped(_) => Some(unknown(FrameKind::User, None)),
                RawFrame::Truncated => Some(Frame::marker("[truncated]")),
                RawFrame::Marker(name) => Some(Frame::marker(name)),
            };
            // A placeholder keeps each address queued once.
            names.spans.insert(*raw, (0, 0));
            if let Some(frame) = known {
                names.insert(builder, *raw, [frame]);
            }
        }

        let kernel_names = symbolizer.symbolize_kernel(&kernel);
        for (addr, sym) in kernel.iter().zip(kernel_names) {
            let frame = match sym {
                Some(sym) => frame_from(sym, FrameKind::Kernel, Some("[kernel.kallsyms]")),
                None => unknown(FrameKind::Kernel, Some("[kernel.kallsyms]")),
            };
            names.insert(builder, RawFrame::Kernel(*addr), [frame]);
        }

        for (module, offsets) in by_module {
            let key = &table.modules[module as usize];
            let (module_name, resolved) = match key {
                ModuleKey::Vdso => ("[vdso]".to_string(), symbolizer.symbolize_vdso(&offsets)),
                ModuleKey::File { path, build_id } => {
                    let name = file_name(path);
                    let resolved = symbolizer
                        .symbolize_file(Path::new(&**path), build_id.as_deref(), &offsets)
                        .unwrap_or_else(|_| vec![Vec::new(); offsets.len()]);
                    (name, resolved)
                }
            };
            for (offset, syms) in offsets.iter().zip(resolved) {
                let raw = RawFrame::User {
                    module,
                    offset: *offset,
                };
                if syms.is_empty() {
                    names.insert(builder, raw, [unknown(FrameKind::User, Some(&module_name))]);
                } else {
                    let frames = syms
                        .into_iter()
                        .map(|s| frame_from(s, FrameKind::User, Some(&module_name)));
                    names.insert(builder, raw, frames);
                }
            }
        }

        for (pid, addrs) in jit {
            let resolved = symbolizer.symbolize_perf_map(pid, &addrs);
            for (addr, sym) in addrs.iter().zip(resolved) {
                let frame = match sym {
                    Some(sym) => frame_from(sym, FrameKind::User, Some("[jit]")),
                    None => unknown(FrameKind::User, None),
                };
                names.insert(builder, RawFrame::Jit { pid, addr: *addr }, [frame]);
            }
        }

        names
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

/// The last path component: `libc.so.6` for `/usr/lib/x86_64-linux-gnu/libc.so.6`; for a copy
/// in perf's build-id cache (`.debug/ORIGINAL/PATH/BUILDID/elf`), the original file's name.
pub(super) fn file_name(path: &str) -> String {
    let mut parts = path.rsplit('/');
    let last = parts.next().unwrap_or(path);
    if last == "elf" && path.contains("/.debug/") {
        let id = parts.next().unwrap_or("");
        if id.len() >= 16 && id.bytes().all(|b| b.is_ascii_hexdigit()) {
            if let Some(name) = parts.next() {
                return name.to_string();
            }
        }
    }
    last.to_string()
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
    }
}
