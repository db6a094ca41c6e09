//! `stackscope gdb`'s command line.

use std::path::PathBuf;
use std::time::Duration;

use clap::Args;

use super::flags::{
    positive_seconds, seconds, DurationArg, FrequencyArg, OutputArgs, GDB_FREQUENCY,
};

#[derive(Args)]
#[command(after_help = "Examples:\n  \
    qemu-system-x86_64 -smp 2 -kernel mykernel ... -gdb tcp::1234\n  \
    stackscope gdb --remote localhost:1234 --kernel mykernel.elf -F 200 -d 10 -o guest.svg\n  \
    stackscope gdb --remote .osdk-gdb-socket --kernel vmlinux --samples 2000 --cpu-mask 0x1 -o g.folded\n  \
    gdbserver 127.0.0.1:2345 ./prog & stackscope gdb --remote 127.0.0.1:2345 --kernel ./prog -o prog.svg\n\n\
    x86-64, riscv64 and aarch64 targets: the ELF file's architecture is checked against the \
    stub's target description. \
    Each round stops the guest, reads every selected vCPU's registers and stack, and resumes it; \
    rounds wait as long as it takes to keep the guest stopped at most --max-slowdown of the \
    time, and a -F or --interval that would stop it more (by the first rounds' pause) is \
    refused with the rate that would not. \
    Each vCPU is a thread of the profile (cpu0, cpu1, ...). Sampling ends after --samples \
    rounds, after --duration, at Ctrl-C, or when the guest exits; in every case the profile \
    collected so far is written, and stackscope detaches, leaving the guest running.")]
#[command(
    mut_arg("frequency", |a| a.help(format!(
        "Rounds per second [default: {GDB_FREQUENCY}]. Each gap between rounds is drawn between \
         half and one and a half of the mean, so sampling never keeps step with periodic guest \
         work"
    ))),
    mut_arg("duration", |a| a.help(
        "Stop after this many seconds, even in the middle of a round (a stub that stalls or \
         floods cannot hold stackscope past it); detaching then takes at most 2 s more"
    )),
)]
pub struct GdbArgs {
    /// The GDB stub: HOST:PORT (TCP; the last `:` field is a port) or a Unix socket path, as
    /// QEMU's `-gdb tcp::PORT` or `-chardev socket,path=P,server=on,wait=off,id=g -gdb chardev:g`.
    #[arg(long, value_name = "ADDR", default_value = ".osdk-gdb-socket")]
    pub remote: String,

    /// The ELF file the stub runs (guest kernel, or the program under gdbserver): symbols and
    /// unwind tables come from it.
    #[arg(long, visible_alias = "elf", value_name = "ELF")]
    pub kernel: PathBuf,

    #[command(flatten)]
    pub frequency: FrequencyArg,

    /// Seconds between rounds (as the OSDK's --interval); 0 samples as often as --max-slowdown allows
    #[arg(long, value_name = "SECS", value_parser = seconds, conflicts_with = "frequency")]
    pub interval: Option<Duration>,

    /// The most the guest may be slowed down: the share of the time it may be stopped, in
    /// percent (above 0, at most 100). Rounds wait until the time stopped so far allows them;
    /// with --interval 0 they come as often as it allows (at most 5 ms apart on average, the
    /// rest left to that wait). A -F or --interval given that the median pause of the first 8
    /// rounds puts above it is refused, naming the rate it allows; the default -F is only
    /// paced. 100 turns the limit off: rounds come at -F whatever they cost.
    #[arg(long, value_name = "PCT", default_value = "5", value_parser = parse_percent)]
    pub max_slowdown: f64,

    /// Stop after this many rounds (each gives one stack per selected vCPU).
    #[arg(long, value_name = "N", conflicts_with = "duration")]
    pub samples: Option<u64>,

    #[command(flatten)]
    pub duration: DurationArg,

    /// Which vCPUs to sample: bit i selects vCPU i (decimal or 0x hex, up to 128 bits).
    #[arg(long, value_name = "MASK", value_parser = parse_mask, default_value = "0xffffffffffffffffffffffffffffffff")]
    pub cpu_mask: u128,

    /// Shorten Rust names as the Asterinas OSDK does: generics `<...>`, `::{impl#N}` and
    /// `::{closure#N}` removed.
    #[arg(long)]
    pub rust_clean: bool,

    /// Seconds to wait for each reply of the stub before giving up (a thread list, a stop
    /// with its console output, or a library list counts as one reply).
    #[arg(long, value_name = "SECS", default_value = "5", value_parser = positive_seconds)]
    pub timeout: Duration,

    #[command(flatten)]
    pub output: OutputArgs,
}

fn parse_percent(s: &str) -> Result<f64, String> {
    match s.trim_end_matches('%').parse::<f64>() {
        Ok(p) if p > 0.0 && p <= 100.0 => Ok(p),
        Ok(p) => Err(format!("{p} is not above 0 and at most 100")),
        Err(_) => Err(format!("{s:?} is not a percentage such as 5 or 2.5")),
    }
}

fn parse_mask(s: &str) -> Result<u128, String> {
    let parsed = match s.strip_prefix("0x").or_else(|| s.strip_prefix("0X")) {
        Some(hex) => u128::from_str_radix(hex, 16),
        None => s.parse(),
    };
    match parsed {
        Ok(0) => Err("the mask selects no vCPU".into()),
        Ok(m) => Ok(m),
        Err(e) => Err(format!("not a 128-bit number in decimal or 0x hex: {e}")),
    }
}
