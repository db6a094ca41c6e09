//! Where a USDT probe sits in a file: its `.note.stapsdt` notes (SystemTap's SDT format), read
//! through the one ELF reader and turned into the file offsets the kernel attaches at.

use std::path::Path;

use stackscope_symbols::elf::{ElfFile, Note};

use super::near::{did_you_mean, near_matches};
use super::probed_file::open_elf;

/// The places of USDT probe `name` (of `provider`, or of any) in the file at `path`: file
/// offsets of its address and of its semaphore (0: none).
pub(super) fn usdt_sites(
    path: &Path,
    provider: Option<&str>,
    name: &str,
) -> Result<Vec<(u64, u64)>, String> {
    let elf = open_elf(path)?;
    // Where .stapsdt.base is now, against where each note says it was linked (prelink).
    let base = elf.section(".stapsdt.base").map(|s| s.address());
    let to_offset = |addr: u64| elf.segments().iter().find_map(|seg| seg.offset_of(addr));
    let mut sites = Vec::new();
    let mut seen = Vec::new();
    for note in sdt_notes(&elf) {
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
        return Err(no_such_probe(path, provider, name, seen));
    }
    Ok(sites)
}

/// The one line naming a USDT probe that is not in the file, with those that are and are
/// spelled alike.
fn no_such_probe(path: &Path, provider: Option<&str>, name: &str, mut seen: Vec<String>) -> String {
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
    format!(
        "no USDT probe {wanted} in {}{none}{}",
        path.display(),
        did_you_mean(&near)
    )
}

/// One SDT note: the probe's address, the link-time address of `.stapsdt.base`, the
/// semaphore's address, then provider and name (its argument spec is not needed).
struct SdtNote {
    pc: u64,
    base: u64,
    semaphore: u64,
    provider: String,
    name: String,
}

/// The stapsdt notes (type 3, owner "stapsdt") of the file, with addresses of its word size
/// and byte order.
fn sdt_notes(elf: &ElfFile) -> Vec<SdtNote> {
    const NT_STAPSDT: u32 = 3;
    let word = if elf.is_64() { 8 } else { 4 };
    let address = |desc: &[u8], i: usize| -> u64 {
        let bytes = &desc[i * word..(i + 1) * word];
        let mut value = [0u8; 8];
        if elf.is_big_endian() {
            value[8 - word..].copy_from_slice(bytes);
            u64::from_be_bytes(value)
        } else {
            value[..word].copy_from_slice(bytes);
            u64::from_le_bytes(value)
        }
    };
    elf.notes(".note.stapsdt")
        .into_iter()
        .filter(|note: &Note| note.owner == b"stapsdt" && note.kind == NT_STAPSDT)
        .filter(|note| note.desc.len() > 3 * word)
        .filter_map(|note| {
            let mut strings = note.desc[3 * word..]
                .split(|&b| b == 0)
                .map(String::from_utf8_lossy);
            Some(SdtNote {
                pc: address(note.desc, 0),
                base: address(note.desc, 1),
                semaphore: address(note.desc, 2),
                provider: strings.next()?.into_owned(),
                name: strings.next()?.into_owned(),
            })
        })
        .collect()
}
