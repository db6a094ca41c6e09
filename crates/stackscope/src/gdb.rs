//! `stackscope gdb`: sample a guest kernel in QEMU, or a program under gdbserver, over the GDB
//! remote protocol, then write the profile and how long the guest was held per round.

use std::io::IsTerminal;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{bail, Result};
use clap::Args;
use indicatif::{ProgressBar, ProgressStyle};
use stackscope_gdb::{Client, Image, Remote, SamplerOptions};
use stackscope_profile::format;

use crate::cli::{positive_seconds, seconds, OutputArgs};
use crate::output::Output;

/// Rounds per second when neither -F nor --interval is given.
const DEFAULT_FREQUENCY: u64 = 100;

#[derive(Args)]
#[command(after_help = "Examples:\n  \
    qemu-system-x86_64 -smp 2 -kernel mykernel ... -gdb tcp::1234\n  \
    stackscope gdb --remote localhost:1234 --kernel mykernel.elf -F 200 -d 10 -o guest.svg\n  \
    stackscope gdb --remote .osdk-gdb-socket --kernel vmlinux --samples 2000 --cpu-mask 0x1 -o g.folded\n  \
    gdbserver 127.0.0.1:2345 ./prog & stackscope gdb --remote 127.0.0.1:2345 --kernel ./prog -o prog.svg\n\n\
    Each round stops the guest, reads every selected vCPU's registers and stack, and resumes it. \
    Each vCPU is a thread of the profile (cpu0, cpu1, ...). Sampling ends after --samples \
    rounds, after --duration, at Ctrl-C, or when the guest exits; in every case the profile \
    collected so far is written, and stackscope detaches, leaving the guest running.")]
pub struct GdbArgs {
    /// The GDB stub: HOST:PORT (TCP; the last `:` field is a port) or a Unix socket path, as
    /// QEMU's `-gdb tcp::PORT` or `-chardev socket,path=P,server=on,wait=off,id=g -gdb chardev:g`.
    #[arg(long, value_name = "ADDR", default_value = ".osdk-gdb-socket")]
    pub remote: String,

    /// The ELF file the stub runs (guest kernel, or the program under gdbserver): symbols and
    /// unwind tables come from it.
    #[arg(long, visible_alias = "elf", value_name = "ELF")]
    pub kernel: PathBuf,

    /// Rounds per second [default: 100]. Each gap between rounds is drawn between half and one
    /// and a half of the mean, so sampling never keeps step with periodic guest work.
    #[arg(short = 'F', long, value_name = "HZ", conflicts_with = "interval")]
    pub frequency: Option<u64>,

    /// Seconds between rounds (as the OSDK's --interval); 0 samples back to back.
    #[arg(long, value_name = "SECS", value_parser = seconds)]
    pub interval: Option<Duration>,

    /// Stop after this many rounds (each gives one stack per selected vCPU).
    #[arg(long, value_name = "N", conflicts_with = "duration")]
    pub samples: Option<u64>,

    /// Stop after this many seconds, even in the middle of a round (a stub that stalls or
    /// floods cannot hold stackscope past it); detaching then takes at most 2 s more.
    #[arg(short, long, value_name = "SECS", value_parser = positive_seconds)]
    pub duration: Option<Duration>,

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

pub fn run(args: GdbArgs) -> Result<i32> {
    let interval = match (args.frequency, args.interval) {
        (Some(0), _) => bail!("-F must be greater than zero (use --interval 0 for back to back)"),
        (Some(hz), _) => Duration::from_secs_f64(1.0 / hz as f64),
        (None, Some(interval)) => interval,
        (None, None) => Duration::from_secs_f64(1.0 / DEFAULT_FREQUENCY as f64),
    };
    let frequency_hz = match (args.frequency, args.interval) {
        (Some(hz), _) => Some(hz),
        (None, None) => Some(DEFAULT_FREQUENCY),
        _ => None,
    };
    let duration = args.duration;
    let timeout = args.timeout;
    if args.samples == Some(0) {
        bail!("--samples must be greater than zero");
    }

    let image = Image::open(&args.kernel)?;
    let remote = Remote::parse(&args.remote);
    let output = Output::from_args(
        &args.output,
        format!("stackscope: {} at {remote}", args.kernel.display()),
    );
    output.check_writable()?;

    let mut client = Client::connect(&remote, timeout)?;
    let target = stackscope_gdb::prepare(&mut client, image, args.cpu_mask)?;

    let stop = crate::record::stop_on_signals()?;

    let rate = match frequency_hz {
        Some(hz) => format!("{hz} Hz"),
        None if interval.is_zero() => "back to back".to_string(),
        None => format!("every {} s", interval.as_secs_f64()),
    };
    let until = match (args.samples, args.duration) {
        (Some(n), _) => format!("for {n} rounds"),
        (_, Some(d)) => format!("for {} s", d.as_secs_f64()),
        _ => "until Ctrl-C or the guest exits".to_string(),
    };
    let unwinding = if target.image().has_unwind_info() {
        "DWARF CFI"
    } else {
        "frame pointers (no .eh_frame/.debug_frame)"
    };
    eprintln!(
        "stackscope: sampling {} of {} vCPU(s) at {remote} at {rate} {until}, unwinding by {unwinding}",
        target.sampled_vcpus(),
        target.vcpus(),
    );

    let progress = progress_bar(args.samples, duration);
    let options = SamplerOptions {
        interval,
        rounds: args.samples,
        duration,
        cpu_mask: args.cpu_mask,
        rust_clean: args.rust_clean,
        frequency_hz,
    };
    let recording = stackscope_gdb::record(&mut client, target, &options, &stop, |p| {
        if let Some(bar) = &progress {
            match (args.samples, duration) {
                (Some(_), _) => bar.set_position(p.rounds),
                (None, Some(_)) => bar.set_position(p.elapsed.as_millis() as u64),
                _ => bar.set_position(p.rounds),
            }
        }
    });
    if let Some(bar) = progress {
        bar.finish_and_clear();
    }

    if let Some(e) = &recording.failure {
        eprintln!("stackscope: sampling stopped early: {e}");
    }
    let stats = &recording.stats;
    eprintln!(
        "stackscope: gdb: {} rounds, {} stacks in {:.3} s: {:.1} rounds/s, {:.1} stacks/s; guest paused per round: median {:.3} ms, p95 {:.3} ms",
        stats.rounds,
        stats.stacks,
        stats.elapsed.as_secs_f64(),
        stats.rounds_per_sec(),
        stats.stacks_per_sec(),
        stats.pause_median.as_secs_f64() * 1e3,
        stats.pause_p95.as_secs_f64() * 1e3,
    );
    let profile = recording.profile;
    eprint!("{}", format::summary(&profile));
    if profile.samples.is_empty() {
        eprintln!(
            "stackscope: no samples were collected; {} not written",
            output.path.display()
        );
        return Ok(1);
    }
    output.write(&profile)?;
    if !output.is_stdout() {
        eprintln!("stackscope: wrote {}", output.path.display());
    }
    Ok(0)
}

/// A bar on standard error when it is a terminal: by rounds, by time, or a spinner.
fn progress_bar(samples: Option<u64>, duration: Option<Duration>) -> Option<ProgressBar> {
    if !std::io::stderr().is_terminal() {
        return None;
    }
    let bar = match (samples, duration) {
        (Some(n), _) => ProgressBar::new(n).with_style(
            ProgressStyle::with_template("{bar:40} {pos}/{len} rounds {per_sec} ({eta})").ok()?,
        ),
        (None, Some(d)) => ProgressBar::new(d.as_millis() as u64)
            .with_style(ProgressStyle::with_template("{bar:40} {elapsed}/{duration}").ok()?),
        _ => ProgressBar::new_spinner().with_style(
            ProgressStyle::with_template("{spinner} {pos} rounds {per_sec} {elapsed}").ok()?,
        ),
    };
    bar.set_draw_target(indicatif::ProgressDrawTarget::stderr());
    Some(bar)
}
