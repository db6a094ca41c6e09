//! The software `cpu-clock` perf event both Linux sources sample on (it needs no hardware
//! PMU): its rate, checked against what the kernel allows; its `perf_event_attr`; and opening
//! it on a task or a CPU. What a source asks of each sample (callchains, registers, a ring
//! buffer, a BPF program to run) it adds itself.

use std::io;
use std::os::fd::{FromRawFd, OwnedFd};

use perf_event_open_sys as sys;
use sys::bindings as b;
pub use sys::bindings::perf_event_attr;

use crate::error::SampleError;
use crate::kernel::read_sysctl;

/// How often the event fires, on each task or CPU it is opened on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rate {
    /// Samples per second.
    Frequency(u64),
    /// Nanoseconds of cpu-clock per sample.
    Period(u64),
}

impl Rate {
    /// Refuses a rate of zero, and a frequency above `kernel.perf_event_max_sample_rate`
    /// (the kernel would refuse the event with a bare EINVAL).
    pub fn check(self) -> Result<Rate, SampleError> {
        match self {
            Rate::Frequency(0) => Err(SampleError::InvalidConfig(
                "the sampling frequency must be at least 1 Hz".into(),
            )),
            Rate::Period(0) => Err(SampleError::InvalidConfig(
                "the sampling period must be at least 1 ns".into(),
            )),
            Rate::Frequency(hz) => match read_sysctl("perf_event_max_sample_rate") {
                Some(max) if max > 0 && hz > max as u64 => Err(SampleError::FrequencyTooHigh {
                    requested: hz,
                    max: max as u64,
                }),
                _ => Ok(self),
            },
            Rate::Period(_) => Ok(self),
        }
    }
}

/// Now on CLOCK_MONOTONIC, in nanoseconds: the clock of the eBPF program
/// (`bpf_ktime_get_ns`) and of the perf source's samples.
pub fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime fills the timespec it is given.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// The attr of a cpu-clock sampling event firing at `rate`, opened disabled.
pub fn attr(rate: Rate) -> perf_event_attr {
    let mut attr = perf_event_attr {
        type_: b::PERF_TYPE_SOFTWARE,
        size: std::mem::size_of::<perf_event_attr>() as u32,
        config: b::PERF_COUNT_SW_CPU_CLOCK as u64,
        ..Default::default()
    };
    match rate {
        Rate::Frequency(hz) => {
            attr.__bindgen_anon_1.sample_freq = hz;
            attr.set_freq(1);
        }
        Rate::Period(ns) => attr.__bindgen_anon_1.sample_period = ns,
    }
    attr.set_disabled(1);
    attr
}

/// `perf_event_open(attr, pid, cpu, -1, CLOEXEC)`: on task `pid` (-1: every task) and CPU
/// `cpu` (-1: wherever the task runs). The kernel's errno is kept for the caller to explain.
pub fn open(attr: &perf_event_attr, pid: i32, cpu: i32) -> io::Result<OwnedFd> {
    let mut attr = *attr;
    // SAFETY: `attr` is a fully initialised perf_event_attr whose `size` matches its type.
    let fd = unsafe {
        sys::perf_event_open(
            &mut attr,
            pid,
            cpu,
            -1,
            b::PERF_FLAG_FD_CLOEXEC as libc::c_ulong,
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: the kernel just handed us this descriptor and nothing else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_rate_of_zero_is_refused_and_a_frequency_over_the_kernels_limit_names_it() {
        assert!(Rate::Frequency(0).check().is_err());
        assert!(Rate::Period(0).check().is_err());
        assert_eq!(Rate::Period(1), Rate::Period(1).check().unwrap());
        if let Some(max) = read_sysctl("perf_event_max_sample_rate").filter(|&m| m > 0) {
            let over = max as u64 + 1;
            assert!(matches!(
                Rate::Frequency(over).check(),
                Err(SampleError::FrequencyTooHigh { requested, .. }) if requested == over
            ));
        }
    }

    #[test]
    fn the_event_opens_disabled_at_its_rate_on_this_thread() {
        let at_hz = attr(Rate::Frequency(99));
        assert_eq!((at_hz.freq(), at_hz.disabled()), (1, 1));
        // SAFETY: reading the union member this rate wrote.
        assert_eq!(unsafe { at_hz.__bindgen_anon_1.sample_freq }, 99);
        let every = attr(Rate::Period(1_000_000));
        assert_eq!(every.freq(), 0);
        // SAFETY: as above.
        assert_eq!(unsafe { every.__bindgen_anon_1.sample_period }, 1_000_000);
        let mut user_only = every;
        user_only.set_exclude_kernel(1);
        open(&user_only, 0, -1).expect("a cpu-clock event on this thread");
    }
}
