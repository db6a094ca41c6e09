//! What can go wrong loading and running the BPF program, each as one line that names the fix.

use stackscope_process::SampleError;

#[derive(Debug, thiserror::Error)]
pub enum BpfError {
    /// The target or the perf events: missing command, no such pid, bad CPU, perf_event_open.
    #[error(transparent)]
    Sample(#[from] SampleError),
    #[error("loading BPF programs needs root or the CAP_BPF and CAP_PERFMON capabilities (running as uid {euid}): run as root, or `setcap cap_bpf,cap_perfmon+ep` on the stackscope binary")]
    NotPermitted { euid: u32 },
    /// The message names the fix in this crate's terms; a command line words it with its own
    /// flags.
    #[error("this kernel has no BTF type information (/sys/kernel/btf/vmlinux is missing), which the BPF program needs: use a kernel built with CONFIG_DEBUG_INFO_BTF=y, or the perf_event source")]
    NoBtf,
    #[error("the kernel's verifier rejected BPF program {program} (kernel 5.17 or newer is needed for its loops): {log}")]
    Verifier { program: String, log: String },
    /// A probe that cannot attach, with the near matches of what it names.
    #[error("{0}")]
    Probe(String),
    #[error("cannot {what}: {detail}")]
    Bpf { what: String, detail: String },
    #[error("{what}: {source}")]
    Io {
        what: String,
        source: std::io::Error,
    },
}

impl BpfError {
    pub(crate) fn bpf(what: impl Into<String>, err: impl std::fmt::Display) -> Self {
        BpfError::Bpf {
            what: what.into(),
            detail: err.to_string(),
        }
    }
}
