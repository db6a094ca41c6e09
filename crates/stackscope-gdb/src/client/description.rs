//! The stub's target description (`qXfer:features:read:target.xml` and the files it
//! includes): the architecture the stub runs, checked against the ELF file's, and its
//! registers in the order of the `g` reply.

use std::path::Path;

use super::loaded::attribute;
use stackscope_stacks::arch::Arch;

use super::{Client, Layout, MAX_OBJECT};
use crate::error::Error;
use crate::packet::Stream;

/// Most description files read (target.xml and its includes): more than any stub sends.
const MAX_FILES: usize = 64;

/// What a target description says, its files read in document order.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Description {
    pub architecture: Option<String>,
    /// (register number, name, bits).
    pub registers: Vec<(u64, String, usize)>,
}

impl<S: Stream> Client<S> {
    /// Checks that the stub runs `arch`, the architecture of the ELF file at `file`, and
    /// learns where the registers a walk needs sit in a `g` reply: from the stub's target
    /// description when it has one (QEMU and gdbserver do), else in GDB's default order for
    /// `arch`.
    pub fn describe(&mut self, arch: Arch, file: &Path) -> Result<(), Error> {
        self.layout = Layout::default_of(arch);
        if !self.features.target_description {
            return Ok(());
        }
        let mut description = Description::default();
        let mut files = 0;
        self.read_description("target.xml", &mut description, &mut files)?;
        let mismatch = |described: String| Error::Architecture {
            file: file.display().to_string(),
            arch: arch.name(),
            peer: self.conn.peer().to_string(),
            described,
        };
        if let Some(described) = &description.architecture {
            if !describes(described, arch) {
                return Err(mismatch(described.clone()));
            }
        }
        if description.registers.is_empty() {
            return Ok(());
        }
        description.registers.sort_by_key(|r| r.0);
        let registers: Vec<(String, usize)> = description
            .registers
            .into_iter()
            .map(|(_, name, bits)| (name, bits))
            .collect();
        self.layout = Layout::of(arch, &registers).map_err(|why| {
            let architecture = description
                .architecture
                .as_deref()
                .unwrap_or("no architecture");
            mismatch(format!("{architecture}, and {why}"))
        })?;
        Ok(())
    }

    /// Reads the description file `annex` into `description`, the files it includes in place.
    fn read_description(
        &mut self,
        annex: &str,
        description: &mut Description,
        files: &mut usize,
    ) -> Result<(), Error> {
        *files += 1;
        if *files > MAX_FILES {
            return Err(self.conn.excess(format!(
                "described the target in more than {MAX_FILES} files"
            )));
        }
        let xml = self.read_object("features", annex, MAX_OBJECT)?;
        for element in parse_elements(&String::from_utf8_lossy(&xml)) {
            match element {
                Element::Architecture(name) => description.architecture = Some(name),
                Element::Register { number, name, bits } => {
                    let next = description.registers.last().map_or(0, |r| r.0 + 1);
                    description
                        .registers
                        .push((number.unwrap_or(next), name, bits));
                }
                Element::Include(href) => self.read_description(&href, description, files)?,
            }
        }
        Ok(())
    }
}

/// An element of a description file that matters here.
#[derive(Debug, PartialEq, Eq)]
enum Element {
    Architecture(String),
    Include(String),
    Register {
        number: Option<u64>,
        name: String,
        bits: usize,
    },
}

/// The `<architecture>`, `<xi:include href=...>` and `<reg name=... bitsize=...>` elements of
/// one description file, in document order.
fn parse_elements(xml: &str) -> Vec<Element> {
    let mut elements = Vec::new();
    let mut rest = xml;
    while let Some(start) = rest.find('<') {
        rest = &rest[start + 1..];
        let end = rest.find('>').unwrap_or(rest.len());
        let tag = &rest[..end];
        let (kind, inside) = tag.split_once(char::is_whitespace).unwrap_or((tag, ""));
        let inside = format!(" {inside}");
        match kind {
            "architecture" => {
                let text = &rest[(end + 1).min(rest.len())..];
                let text = &text[..text.find('<').unwrap_or(text.len())];
                elements.push(Element::Architecture(text.trim().to_string()));
            }
            "xi:include" => {
                if let Some(href) = attribute(&inside, "href") {
                    elements.push(Element::Include(href));
                }
            }
            "reg" => {
                let name = attribute(&inside, "name");
                let bits = attribute(&inside, "bitsize").and_then(|b| b.parse().ok());
                if let (Some(name), Some(bits)) = (name, bits) {
                    let number = attribute(&inside, "regnum").and_then(|n| n.parse().ok());
                    elements.push(Element::Register { number, name, bits });
                }
            }
            _ => {}
        }
        rest = &rest[end.min(rest.len())..];
    }
    elements
}

/// True when a target description's `<architecture>` (GDB's BFD name) is `arch`.
fn describes(architecture: &str, arch: Arch) -> bool {
    let bfd = match arch {
        Arch::X86_64 => "i386:x86-64",
        Arch::Riscv64 => "riscv:rv64",
        Arch::Aarch64 => "aarch64",
    };
    architecture == bfd || architecture.starts_with(&format!("{bfd}:"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn descriptions_name_architectures_as_gdb_does() {
        assert!(describes("i386:x86-64", Arch::X86_64));
        assert!(describes("riscv:rv64", Arch::Riscv64));
        assert!(describes("aarch64", Arch::Aarch64));
        assert!(!describes("riscv:rv64", Arch::X86_64));
        assert!(!describes("riscv:rv32", Arch::Riscv64));
    }

    #[test]
    fn elements_of_a_description_in_document_order() {
        let xml = r#"<?xml version="1.0"?>
<!DOCTYPE target SYSTEM "gdb-target.dtd">
<target><architecture>riscv:rv64</architecture>
<xi:include href="riscv-64bit-cpu.xml"/>
<feature name="org.gnu.gdb.riscv.cpu">
  <reg name="zero" bitsize="64" type="int"/>
  <reg name="pc" bitsize="64" type="code_ptr" regnum="32"/>
</feature></target>"#;
        assert_eq!(
            parse_elements(xml),
            [
                Element::Architecture("riscv:rv64".into()),
                Element::Include("riscv-64bit-cpu.xml".into()),
                Element::Register {
                    number: None,
                    name: "zero".into(),
                    bits: 64
                },
                Element::Register {
                    number: Some(32),
                    name: "pc".into(),
                    bits: 64
                },
            ]
        );
    }
}
