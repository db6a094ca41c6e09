//! What the running kernel offers and allows: its sysctls and its online CPUs.

use std::io;

use crate::error::SampleError;

/// `kernel.NAME` from /proc/sys, when readable and a number.
pub fn read_sysctl(name: &str) -> Option<i64> {
    std::fs::read_to_string(format!("/proc/sys/kernel/{name}"))
        .ok()?
        .trim()
        .parse()
        .ok()
}

/// Online CPU numbers, from `/sys/devices/system/cpu/online`.
pub fn online_cpus() -> io::Result<Vec<u32>> {
    let text = std::fs::read_to_string("/sys/devices/system/cpu/online")?;
    parse_cpu_list(&text)
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, format!("bad CPU list {text:?}")))
}

/// Parses a kernel CPU list such as `0-3,6,8-9`.
fn parse_cpu_list(text: &str) -> Option<Vec<u32>> {
    let mut cpus = Vec::new();
    for part in text.trim().split(',').filter(|p| !p.is_empty()) {
        match part.split_once('-') {
            Some((a, b)) => {
                let (a, b): (u32, u32) = (a.parse().ok()?, b.parse().ok()?);
                if a > b {
                    return None;
                }
                cpus.extend(a..=b);
            }
            None => cpus.push(part.parse().ok()?),
        }
    }
    Some(cpus)
}

/// The CPUs to sample: every online one, or `only` when it is online.
pub fn choose_cpus(only: Option<u32>) -> Result<Vec<u32>, SampleError> {
    let online = online_cpus().map_err(|source| SampleError::Io {
        what: "cannot read the online CPUs from /sys/devices/system/cpu/online".into(),
        source,
    })?;
    match only {
        None => Ok(online),
        Some(cpu) if online.contains(&cpu) => Ok(vec![cpu]),
        Some(cpu) => Err(SampleError::InvalidCpu {
            cpu,
            online: std::fs::read_to_string("/sys/devices/system/cpu/online")
                .map(|s| s.trim().to_string())
                .unwrap_or_default(),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_cpu_lists() {
        assert_eq!(parse_cpu_list("0-1\n"), Some(vec![0, 1]));
        assert_eq!(parse_cpu_list("0,2-4,7"), Some(vec![0, 2, 3, 4, 7]));
        assert_eq!(parse_cpu_list("3-1"), None);
        assert_eq!(parse_cpu_list("x"), None);
    }
}
