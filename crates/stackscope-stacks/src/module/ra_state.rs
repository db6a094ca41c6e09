//! aarch64 code built with pointer authentication (`-mbranch-protection=standard`, as
//! distributions build their arm64 packages) says in its `.eh_frame` where its return address
//! is signed, with `DW_CFA_AARCH64_negate_ra_state` (opcode 0x2d) after each `paciasp`. The
//! walk has no use for that state (it strips a return address's signature by mask, see
//! `walk::ptr_auth_mask`), but framehop's reading of `.eh_frame` takes the opcode for an
//! unknown instruction and gives up on the whole function. So an aarch64 file's `.eh_frame` is
//! handed over with each of those opcodes made a `DW_CFA_nop`: one byte for one byte, so every
//! offset, `.eh_frame_hdr`'s included, stays as it was.
//!
//! The opcodes are found by decoding every CIE's and FDE's instructions, never by searching
//! bytes (0x2d is also an operand's value). An entry this reader cannot follow (64-bit
//! lengths, an unknown augmentation or instruction) is left as it is.

use std::collections::HashMap;

use gimli::constants::*;

/// The opcode, and what it becomes.
const NEGATE_RA_STATE: u8 = 0x2d;
const NOP: u8 = 0x00;

/// `eh_frame` with every `DW_CFA_AARCH64_negate_ra_state` made a `DW_CFA_nop`; `None` when it
/// has none, so the file's own bytes are used.
pub(crate) fn without_ra_state(eh_frame: &[u8]) -> Option<Vec<u8>> {
    let found = ra_state_opcodes(eh_frame);
    if found.is_empty() {
        return None;
    }
    let mut patched = eh_frame.to_vec();
    for at in found {
        patched[at] = NOP;
    }
    Some(patched)
}

/// Where the section's `DW_CFA_AARCH64_negate_ra_state` opcodes are.
fn ra_state_opcodes(section: &[u8]) -> Vec<usize> {
    let mut found = Vec::new();
    let mut cies: HashMap<usize, Option<Cie>> = HashMap::new();
    let mut at = 0;
    while let Some(length) = read_u32(section, at) {
        // A zero length ends the section; 64-bit lengths are not followed.
        if length == 0 || length == u32::MAX {
            break;
        }
        let body = at + 4;
        let end = body.saturating_add(length as usize).min(section.len());
        let Some(id) = read_u32(section, body) else {
            break;
        };
        let instructions = if id == 0 {
            parse_cie(section, at).map(|cie| (cie.instructions, cie.encoding))
        } else {
            let cie_at = body.wrapping_sub(id as usize);
            let cie = *cies
                .entry(cie_at)
                .or_insert_with(|| parse_cie(section, cie_at));
            cie.and_then(|cie| fde_instructions(section, body + 4, end, cie))
        };
        if let Some((start, encoding)) = instructions {
            scan(section, start..end, encoding, &mut found);
        }
        at = end;
    }
    found
}

/// What an FDE needs of its CIE; for the CIE itself, where its own instructions start.
#[derive(Clone, Copy)]
struct Cie {
    /// The encoding of addresses in its FDEs (the `R` augmentation; absolute by default).
    encoding: u8,
    /// Whether its FDEs carry augmentation data (the `z` augmentation).
    augmented: bool,
    instructions: usize,
}

/// Reads the CIE whose length field is at `at`.
fn parse_cie(section: &[u8], at: usize) -> Option<Cie> {
    let length = read_u32(section, at)? as usize;
    let end = (at + 4).checked_add(length)?.min(section.len());
    if read_u32(section, at + 4)? != 0 {
        return None;
    }
    let mut pos = at + 8;
    let version = *section.get(pos)?;
    pos += 1;
    let augmentation_len = section.get(pos..end)?.iter().position(|&b| b == 0)?;
    let augmentation = section.get(pos..pos + augmentation_len)?;
    pos += augmentation_len + 1;
    if augmentation.starts_with(b"eh") {
        return None;
    }
    pos = skip_leb(section, pos)?; // code alignment
    pos = skip_leb(section, pos)?; // data alignment
    pos = if version == 1 {
        pos + 1
    } else {
        skip_leb(section, pos)?
    };
    let mut cie = Cie {
        encoding: DW_EH_PE_absptr.0,
        augmented: augmentation.first() == Some(&b'z'),
        instructions: pos,
    };
    if !cie.augmented {
        return (augmentation.is_empty()).then_some(cie);
    }
    let (data_len, data) = read_uleb(section, pos)?;
    let data_end = data.checked_add(usize::try_from(data_len).ok()?)?;
    let mut p = data;
    for &letter in &augmentation[1..] {
        match letter {
            b'R' => {
                cie.encoding = *section.get(p)?;
                p += 1;
            }
            b'L' => p += 1,
            b'P' => {
                let encoding = *section.get(p)?;
                p = skip_pointer(section, p + 1, encoding)?;
            }
            b'S' | b'B' => {}
            // The rest of the data is this letter's, unknown here; the encoding is known
            // only if `R` came first.
            _ => break,
        }
    }
    cie.instructions = data_end;
    (cie.instructions <= end).then_some(cie)
}

/// Where the instructions of the FDE whose address fields start at `pos` begin.
fn fde_instructions(section: &[u8], pos: usize, end: usize, cie: Cie) -> Option<(usize, u8)> {
    // The initial location, in the CIE's encoding, then the range, in its format alone.
    let pos = skip_pointer(section, pos, cie.encoding)?;
    let mut pos = skip_pointer(section, pos, cie.encoding & 0x0f)?;
    if cie.augmented {
        let (len, data) = read_uleb(section, pos)?;
        pos = data.checked_add(usize::try_from(len).ok()?)?;
    }
    (pos <= end).then_some((pos, cie.encoding))
}

/// Decodes the instructions in `range`, noting where each negate_ra_state opcode is; stops
/// at an instruction it does not know.
fn scan(section: &[u8], range: std::ops::Range<usize>, encoding: u8, found: &mut Vec<usize>) {
    let mut pos = range.start;
    while pos < range.end {
        let Some(next) = instruction_end(section, pos, encoding) else {
            return;
        };
        if section[pos] == NEGATE_RA_STATE {
            found.push(pos);
        }
        pos = next;
    }
}

/// Where the instruction at `pos` ends; `None` for one not known here.
#[allow(non_upper_case_globals)] // gimli names its constants as DWARF does.
fn instruction_end(section: &[u8], pos: usize, encoding: u8) -> Option<usize> {
    let opcode = *section.get(pos)?;
    let operands = pos + 1;
    // The high two bits carry an operand in the opcode itself.
    match opcode & 0xc0 {
        0x40 | 0xc0 => return Some(operands),
        0x80 => return skip_leb(section, operands),
        _ => {}
    }
    let leb = |p| skip_leb(section, p);
    let block = |p| {
        let (len, data) = read_uleb(section, p)?;
        data.checked_add(usize::try_from(len).ok()?)
    };
    match DwCfa(opcode) {
        DW_CFA_nop | DW_CFA_remember_state | DW_CFA_restore_state => Some(operands),
        DW_CFA_set_loc => skip_pointer(section, operands, encoding),
        DW_CFA_advance_loc1 => Some(operands + 1),
        DW_CFA_advance_loc2 => Some(operands + 2),
        DW_CFA_advance_loc4 => Some(operands + 4),
        DW_CFA_restore_extended
        | DW_CFA_undefined
        | DW_CFA_same_value
        | DW_CFA_def_cfa_register
        | DW_CFA_def_cfa_offset
        | DW_CFA_def_cfa_offset_sf
        | DW_CFA_GNU_args_size => leb(operands),
        DW_CFA_offset_extended
        | DW_CFA_register
        | DW_CFA_def_cfa
        | DW_CFA_offset_extended_sf
        | DW_CFA_def_cfa_sf
        | DW_CFA_val_offset
        | DW_CFA_val_offset_sf
        | DW_CFA_GNU_negative_offset_extended => leb(leb(operands)?),
        DW_CFA_def_cfa_expression => block(operands),
        DW_CFA_expression | DW_CFA_val_expression => block(leb(operands)?),
        DW_CFA_AARCH64_negate_ra_state => Some(operands),
        _ => None,
    }
}

/// Skips a pointer of `encoding` at `pos`.
#[allow(non_upper_case_globals)] // gimli names its constants as DWARF does.
fn skip_pointer(section: &[u8], pos: usize, encoding: u8) -> Option<usize> {
    if encoding == DW_EH_PE_omit.0 {
        return Some(pos);
    }
    let end = match DwEhPe(encoding & 0x0f) {
        DW_EH_PE_absptr | DW_EH_PE_udata8 | DW_EH_PE_sdata8 => pos + 8,
        DW_EH_PE_udata2 | DW_EH_PE_sdata2 => pos + 2,
        DW_EH_PE_udata4 | DW_EH_PE_sdata4 => pos + 4,
        DW_EH_PE_uleb128 | DW_EH_PE_sleb128 => skip_leb(section, pos)?,
        _ => return None,
    };
    (end <= section.len()).then_some(end)
}

fn read_u32(section: &[u8], at: usize) -> Option<u32> {
    let bytes = section.get(at..at.checked_add(4)?)?;
    Some(u32::from_le_bytes(bytes.try_into().ok()?))
}

/// Reads an unsigned LEB128 number at `pos`: its value and where it ends.
fn read_uleb(section: &[u8], pos: usize) -> Option<(u64, usize)> {
    let mut value = 0u64;
    for (i, &byte) in section.get(pos..)?.iter().enumerate().take(10) {
        value |= u64::from(byte & 0x7f) << (7 * i);
        if byte & 0x80 == 0 {
            return Some((value, pos + i + 1));
        }
    }
    None
}

/// Where the LEB128 number (signed or not) at `pos` ends.
fn skip_leb(section: &[u8], pos: usize) -> Option<usize> {
    read_uleb(section, pos).map(|(_, end)| end)
}

#[cfg(test)]
mod tests {
    use super::*;
    use gimli::{BaseAddresses, CieOrFde, EhFrame, LittleEndian, UnwindSection, Vendor};
    use std::process::Command;

    /// Counts the entries gimli reads whole, and their negate_ra_state instructions, reading
    /// with `vendor`'s instructions.
    fn read_all(section: &[u8], vendor: Vendor) -> (usize, usize) {
        let mut eh_frame = EhFrame::new(section, LittleEndian);
        eh_frame.set_address_size(8);
        eh_frame.set_vendor(vendor);
        let bases = BaseAddresses::default().set_eh_frame(0);
        let mut entries = eh_frame.entries(&bases);
        let (mut whole, mut negates) = (0, 0);
        while let Some(entry) = entries.next().unwrap() {
            let CieOrFde::Fde(partial) = entry else {
                continue;
            };
            let fde = partial.parse(EhFrame::cie_from_offset).unwrap();
            let mut instructions = fde.instructions(&eh_frame, &bases);
            let mut ok = true;
            loop {
                match instructions.next() {
                    Ok(Some(gimli::CallFrameInstruction::NegateRaState)) => negates += 1,
                    Ok(Some(_)) => {}
                    Ok(None) => break,
                    Err(_) => {
                        ok = false;
                        break;
                    }
                }
            }
            whole += usize::from(ok);
        }
        (whole, negates)
    }

    #[test]
    fn pac_signed_functions_read_whole_with_their_ra_state_made_nops() {
        let dir = tempfile::tempdir().unwrap();
        let source = dir.path().join("pac.c");
        // Functions that call, so each signs its return address; one with a big frame and
        // a variable-length array, for more kinds of instruction.
        std::fs::write(
            &source,
            "void g(long *);\n\
             long f(long n) { long a[n]; g(a); return a[0] + 1; }\n\
             long h(long n) { long a[600]; a[n & 511] = n; g(a); return a[1]; }\n\
             long k(long n) { return f(n) + h(n); }\n",
        )
        .unwrap();
        let object = dir.path().join("pac.o");
        let built = Command::new("aarch64-linux-gnu-gcc")
            .args(["-O2", "-mbranch-protection=standard", "-c", "-o"])
            .arg(&object)
            .arg(&source)
            .status()
            .expect(
                "aarch64-linux-gnu-gcc runs (apt gcc-aarch64-linux-gnu: scripts/install-deps.sh)",
            );
        assert!(built.success());
        let data = std::fs::read(&object).unwrap();
        let file = object::File::parse(&*data).unwrap();
        use object::{Object, ObjectSection};
        let eh_frame = file
            .section_by_name(".eh_frame")
            .unwrap()
            .uncompressed_data()
            .unwrap();

        let (whole, negates) = read_all(&eh_frame, Vendor::AArch64);
        assert_eq!(whole, 3, "three functions' rules, read knowing the opcode");
        assert!(negates >= 3, "each function signs its return address");
        // Without knowing the opcode, none of them reads.
        assert_eq!(read_all(&eh_frame, Vendor::Default), (0, 0));

        let patched = without_ra_state(&eh_frame).expect("opcodes to replace");
        assert_eq!(patched.len(), eh_frame.len());
        let changed = eh_frame
            .iter()
            .zip(&patched)
            .filter(|(a, b)| a != b)
            .count();
        assert_eq!(changed, negates, "exactly the opcodes, nothing else");
        assert_eq!(read_all(&patched, Vendor::Default), (3, 0));
        // Rules without the opcode are handed over as they are.
        assert_eq!(without_ra_state(&patched), None);
    }
}
