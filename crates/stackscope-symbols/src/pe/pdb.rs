//! Finding the PDB of a PE image and naming the image's RVAs from it.
//!
//! The PDB is looked up, in this order, as:
//!
//! 1. the path the image's CodeView record states (where the linker wrote it);
//! 2. the PDB's file name next to the image;
//! 3. each entry of `_NT_SYMBOL_PATH` (`;`-separated), in its order: a symbol store
//!    (`srv*STORE*...*URL`, `symsrv*DLL*STORE*...*URL` or `cache*STORE`) by the store's
//!    layout `STORE/NAME/IDAGE/NAME` (ID the GUID as 32 hex digits, AGE in hex), a plain
//!    directory as `DIR/NAME` and by that same layout.
//!
//! The first file whose own GUID and age (its PDB stream's GUID, its DBI stream's age) are
//! the CodeView record's is used; any other is passed over, as a PDB of another build names
//! wrong functions. When none is found, and stackscope was built with the `symbol-server`
//! feature, the servers of each `srv*` entry are asked, in order, for
//! `URL/NAME/IDAGE/NAME`, and the answer is kept in the entry's first store if it matches
//! (plain PDBs only: a server's compressed `NAME.pd_` or `file.ptr` answers are not read).
//! Without the feature, only PDBs already in a store (a debugger's download cache, for one)
//! are found there.

use std::fs::File;
use std::path::{Path, PathBuf};

use pdb_addr2line::pdb::{FallibleIterator, SourceLanguage, SymbolData, PDB};
use pdb_addr2line::ContextPdbData;

use super::CodeView;
use crate::sym_frame::sym_frame;
use crate::SymFrame;

/// The environment variable listing where PDBs are, as Windows debuggers read it.
pub const SYMBOL_PATH_ENV: &str = "_NT_SYMBOL_PATH";

/// The places `_NT_SYMBOL_PATH` lists, in its order.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SymbolPath {
    entries: Vec<Entry>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Entry {
    /// A directory holding PDBs by name (or as a store).
    Dir(PathBuf),
    /// Symbol stores on this machine, and the servers that would fill them.
    Stores {
        stores: Vec<PathBuf>,
        servers: Vec<String>,
    },
}

impl SymbolPath {
    /// What `_NT_SYMBOL_PATH` says; nothing when it is unset.
    pub fn from_env() -> Self {
        std::env::var(SYMBOL_PATH_ENV)
            .map(|value| Self::parse(&value))
            .unwrap_or_default()
    }

    /// Parses a symbol path: `;`-separated entries, each a directory, or `srv*`, `symsrv*`
    /// or `cache*` followed by `*`-separated stores and server URLs.
    pub fn parse(value: &str) -> Self {
        let entries = value
            .split(';')
            .map(str::trim)
            .filter(|entry| !entry.is_empty())
            .map(|entry| {
                let mut parts = entry.split('*');
                let head = parts.next().unwrap_or_default().to_ascii_lowercase();
                match head.as_str() {
                    "srv" | "cache" => stores(parts),
                    // The DLL that would serve it comes first.
                    "symsrv" => stores(parts.skip(1)),
                    _ => Entry::Dir(PathBuf::from(entry)),
                }
            })
            .collect();
        SymbolPath { entries }
    }

    /// The servers listed, which PDBs missing from the stores would come from.
    pub fn servers(&self) -> impl Iterator<Item = &str> {
        self.entries
            .iter()
            .flat_map(|entry| match entry {
                Entry::Stores { servers, .. } => servers.as_slice(),
                Entry::Dir(_) => &[],
            })
            .map(String::as_str)
    }

    /// The places to look for the PDB `codeview` names, in order, for the image at `image`.
    fn candidates(&self, image: &Path, codeview: &CodeView) -> Vec<PathBuf> {
        let name = codeview.file_name();
        let id = codeview.store_id();
        let in_store = |store: &Path| store.join(name).join(&id).join(name);
        let mut candidates = Vec::new();
        if !codeview.path.is_empty() {
            candidates.push(PathBuf::from(&codeview.path));
        }
        if let Some(dir) = image.parent() {
            candidates.push(dir.join(name));
        }
        for entry in &self.entries {
            match entry {
                Entry::Dir(dir) => {
                    candidates.push(dir.join(name));
                    candidates.push(in_store(dir));
                }
                Entry::Stores { stores, .. } => {
                    candidates.extend(stores.iter().map(|s| in_store(s)))
                }
            }
        }
        candidates
    }

    /// The first PDB, in the lookup order, whose GUID and age are `codeview`'s; else, with
    /// the `symbol-server` feature, one downloaded into a store.
    pub fn find(&self, image: &Path, codeview: &CodeView) -> Option<PathBuf> {
        self.candidates(image, codeview)
            .into_iter()
            .filter(|candidate| candidate.is_file())
            .find(|candidate| matches(candidate, codeview))
            .or_else(|| self.download(codeview))
    }

    #[cfg(not(feature = "symbol-server"))]
    fn download(&self, _: &CodeView) -> Option<PathBuf> {
        None
    }

    /// The PDB `codeview` states, from the first server that has it, kept in the first store
    /// of the server's entry.
    #[cfg(feature = "symbol-server")]
    fn download(&self, codeview: &CodeView) -> Option<PathBuf> {
        let name = codeview.file_name();
        let id = codeview.store_id();
        // A name with a directory in it could write anywhere.
        if name.is_empty() || name.contains(['/', '\\']) || name == ".." {
            return None;
        }
        self.entries.iter().find_map(|entry| {
            let Entry::Stores { stores, servers } = entry else {
                return None;
            };
            let target = stores.first()?.join(name).join(&id).join(name);
            servers.iter().find_map(|server| {
                let url = format!("{}/{name}/{id}/{name}", server.trim_end_matches('/'));
                download::fetch(&url, &target).ok()?;
                if matches(&target, codeview) {
                    Some(target.clone())
                } else {
                    let _ = std::fs::remove_file(&target);
                    None
                }
            })
        })
    }
}

/// Symbol servers' answers, over HTTP.
#[cfg(feature = "symbol-server")]
mod download {
    use std::io;
    use std::path::Path;
    use std::time::Duration;

    /// How long a server may take to answer, and to send each part of its answer.
    const TIMEOUT: Duration = Duration::from_secs(10);

    /// Writes what `url` answers to `target` (through a file beside it, so that no half
    /// download is ever taken for a PDB); an error for anything but a whole 200 answer.
    pub(super) fn fetch(url: &str, target: &Path) -> io::Result<()> {
        let config = ureq::Agent::config_builder()
            .timeout_connect(Some(TIMEOUT))
            .timeout_recv_response(Some(TIMEOUT))
            .timeout_per_read(Some(TIMEOUT))
            .user_agent(concat!("stackscope/", env!("CARGO_PKG_VERSION")))
            .build();
        let agent = ureq::Agent::new_with_config(config);
        let response = agent.get(url).call().map_err(io::Error::other)?;
        std::fs::create_dir_all(target.parent().unwrap_or(Path::new(".")))?;
        let partial = target.with_extension("part");
        let mut file = std::fs::File::create(&partial)?;
        let copied = io::copy(&mut response.into_body().into_reader(), &mut file);
        drop(file);
        match copied {
            Ok(_) => std::fs::rename(&partial, target),
            Err(e) => {
                let _ = std::fs::remove_file(&partial);
                Err(e)
            }
        }
    }
}

/// `srv*`'s parts: URLs are servers, anything else a store on this machine.
fn stores<'a>(parts: impl Iterator<Item = &'a str>) -> Entry {
    let (servers, stores): (Vec<&str>, Vec<&str>) =
        parts.filter(|part| !part.is_empty()).partition(|part| {
            let lower = part.to_ascii_lowercase();
            lower.starts_with("http://") || lower.starts_with("https://")
        });
    Entry::Stores {
        stores: stores.into_iter().map(PathBuf::from).collect(),
        servers: servers.into_iter().map(str::to_string).collect(),
    }
}

/// Whether the PDB at `path` is the one `codeview` states.
pub fn matches(path: &Path, codeview: &CodeView) -> bool {
    let opened = crate::foreign::open(path, crate::foreign::Kind::Binary);
    let Some(mut pdb) = opened.ok().and_then(|f| PDB::open(f).ok()) else {
        return false;
    };
    let Ok(info) = pdb.pdb_information() else {
        return false;
    };
    // The DBI stream's age is the one images record; the PDB stream's may have moved on.
    let age = pdb
        .debug_information()
        .ok()
        .and_then(|dbi| dbi.age())
        .unwrap_or(info.age);
    info.guid.to_bytes_le() == codeview.guid && age == codeview.age
}

/// Names `rvas` from the PDB at `path`: for each, its frames outermost first (the function,
/// then those inlined into it); empty where the PDB knows no function there. Functions of
/// C++ code are named with their argument types, as the Itanium demangler names them on
/// Linux; those of C and Rust code without, as their symbols name them there.
pub(crate) fn name_rvas(path: &Path, rvas: &[u64]) -> Result<Vec<Vec<SymFrame>>, String> {
    let file =
        crate::foreign::open(path, crate::foreign::Kind::Binary).map_err(|e| e.to_string())?;
    let mut pdb = PDB::open(file).map_err(|e| e.to_string())?;
    let cpp = compiled_from_cpp(&mut pdb, rvas);
    let data = ContextPdbData::try_from_pdb(pdb).map_err(|e| e.to_string())?;
    let context = data.make_context().map_err(|e| e.to_string())?;
    Ok(rvas
        .iter()
        .zip(cpp)
        .map(|(&rva, with_arguments)| {
            let Ok(rva) = u32::try_from(rva) else {
                return Vec::new();
            };
            let Some(found) = context.find_frames(rva).ok().flatten() else {
                return Vec::new();
            };
            // pdb-addr2line lists the innermost first.
            found
                .frames
                .into_iter()
                .rev()
                .enumerate()
                .map(|(depth, frame)| {
                    let mut name = frame.function.unwrap_or_default();
                    // Decorated names (public symbols) are left to the demangler.
                    if !with_arguments && !name.starts_with('?') {
                        name.truncate(without_arguments(&name).len());
                    }
                    let file = frame.file.map(|f| f.into_owned());
                    sym_frame(&name, file, frame.line, depth != 0)
                })
                .collect()
        })
        .collect())
}

/// For each of `rvas`, whether the PDB says the module (object file) whose code holds it
/// was compiled from C++. Only the modules holding one of `rvas` are read.
fn compiled_from_cpp(pdb: &mut PDB<'_, File>, rvas: &[u64]) -> Vec<bool> {
    let mut cpp = vec![false; rvas.len()];
    let (Ok(dbi), Ok(address_map)) = (pdb.debug_information(), pdb.address_map()) else {
        return cpp;
    };
    let mut code: Vec<(u32, u32, usize)> = Vec::new();
    if let Ok(mut contributions) = dbi.section_contributions() {
        while let Ok(Some(contribution)) = contributions.next() {
            if let Some(rva) = contribution.offset.to_rva(&address_map) {
                let end = rva.0.saturating_add(contribution.size);
                code.push((rva.0, end, contribution.module));
            }
        }
    }
    code.sort_unstable();
    let module_of = |rva: u64| {
        let rva = u32::try_from(rva).ok()?;
        let at = code.partition_point(|&(start, _, _)| start <= rva);
        let &(_, end, module) = code[..at].last()?;
        (rva < end).then_some(module)
    };
    let holding: Vec<Option<usize>> = rvas.iter().map(|&rva| module_of(rva)).collect();
    let modules: Vec<_> = match dbi.modules() {
        Ok(modules) => modules.collect().unwrap_or_default(),
        Err(_) => return cpp,
    };
    let mut language = std::collections::HashMap::new();
    for index in holding.iter().flatten() {
        if language.contains_key(index) {
            continue;
        }
        let is_cpp = modules
            .get(*index)
            .and_then(|module| pdb.module_info(module).ok().flatten())
            .is_some_and(|info| {
                let Ok(mut symbols) = info.symbols() else {
                    return false;
                };
                // The compile flags symbol comes first in a module's symbols.
                while let Ok(Some(symbol)) = symbols.next() {
                    if let Ok(SymbolData::CompileFlags(flags)) = symbol.parse() {
                        return matches!(
                            flags.language,
                            SourceLanguage::Cpp | SourceLanguage::ObjCXX
                        );
                    }
                }
                false
            });
        language.insert(*index, is_cpp);
    }
    for (out, module) in cpp.iter_mut().zip(holding) {
        *out = module.is_some_and(|m| language[&m]);
    }
    cpp
}

/// `name` without the argument list the PDB's type formatter appended: `work(int)` is
/// `work`.
fn without_arguments(name: &str) -> &str {
    if !name.ends_with(')') {
        return name;
    }
    let mut depth = 0usize;
    for (at, c) in name.char_indices().rev() {
        match c {
            ')' => depth += 1,
            '(' => {
                depth -= 1;
                if depth == 0 {
                    return &name[..at];
                }
            }
            _ => {}
        }
    }
    name
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn argument_lists_are_cut_at_their_opening_parenthesis() {
        assert_eq!(without_arguments("work(int)"), "work");
        assert_eq!(without_arguments("f(void (*)(int), char)"), "f");
        assert_eq!(
            without_arguments("core::ptr::drop_in_place<u8>"),
            "core::ptr::drop_in_place<u8>"
        );
        assert_eq!(without_arguments("unbalanced)"), "unbalanced)");
    }

    #[test]
    fn symbol_path_entries_keep_their_order_and_kinds() {
        let path = SymbolPath::parse(
            r"C:\syms; SRV*C:\cache*\\share\store*https://msdl.microsoft.com/download/symbols;cache*D:\c;symsrv*symsrv.dll*E:\s*http://x",
        );
        assert_eq!(
            path.entries,
            vec![
                Entry::Dir(PathBuf::from(r"C:\syms")),
                Entry::Stores {
                    stores: vec![PathBuf::from(r"C:\cache"), PathBuf::from(r"\\share\store")],
                    servers: vec!["https://msdl.microsoft.com/download/symbols".to_string()],
                },
                Entry::Stores {
                    stores: vec![PathBuf::from(r"D:\c")],
                    servers: vec![],
                },
                Entry::Stores {
                    stores: vec![PathBuf::from(r"E:\s")],
                    servers: vec!["http://x".to_string()],
                },
            ]
        );
        assert_eq!(path.servers().count(), 2);
        assert_eq!(SymbolPath::parse(""), SymbolPath::default());
    }

    #[test]
    fn candidates_are_the_recorded_path_next_to_the_image_then_the_symbol_path() {
        let codeview = CodeView {
            guid: [0; 16],
            age: 2,
            path: r"C:\build\app.pdb".to_string(),
        };
        let id = "000000000000000000000000000000002";
        let path = SymbolPath::parse("/syms;srv*/cache*https://example.invalid");
        let candidates = path.candidates(Path::new("/opt/app/app.exe"), &codeview);
        let expected: Vec<PathBuf> = vec![
            PathBuf::from(r"C:\build\app.pdb"),
            PathBuf::from("/opt/app/app.pdb"),
            PathBuf::from("/syms/app.pdb"),
            PathBuf::from(format!("/syms/app.pdb/{id}/app.pdb")),
            PathBuf::from(format!("/cache/app.pdb/{id}/app.pdb")),
        ];
        assert_eq!(candidates, expected);
    }
}
