//! Image paths as the kernel logs them (`\Device\HarddiskVolume3\Windows\System32\ntdll.dll`,
//! `\SystemRoot\system32\ntoskrnl.exe`, `\??\C:\...`) turned into the drive-letter paths the
//! symbolizer opens (`C:\Windows\System32\ntdll.dll`). The session reads the device of each
//! drive letter and the Windows directory once; the turning itself is plain text.

/// Where each drive letter's device is, and where Windows is.
#[derive(Debug, Clone, Default)]
pub struct DevicePaths {
    /// (`\Device\HarddiskVolume3`, `C:`), longest device first.
    drives: Vec<(String, String)>,
    /// `C:\Windows`, for `\SystemRoot\`.
    system_root: Option<String>,
}

impl DevicePaths {
    pub fn new(drives: Vec<(String, String)>, system_root: Option<String>) -> Self {
        let mut drives = drives;
        // `\Device\HarddiskVolume1` is a prefix of `\Device\HarddiskVolume10`.
        drives.sort_by_key(|(device, _)| std::cmp::Reverse(device.len()));
        DevicePaths {
            drives,
            system_root,
        }
    }

    /// The drive-letter path of a logged path; a path it cannot place is kept as logged.
    pub fn dos_path(&self, logged: &str) -> String {
        if let Some(rest) = logged.strip_prefix(r"\??\") {
            return rest.to_string();
        }
        if let (Some(root), Some(rest)) =
            (&self.system_root, strip_prefix_ci(logged, r"\SystemRoot\"))
        {
            return format!(r"{root}\{rest}");
        }
        for (device, drive) in &self.drives {
            if let Some(rest) = strip_prefix_ci(logged, device) {
                if rest.starts_with('\\') {
                    return format!("{drive}{rest}");
                }
            }
        }
        logged.to_string()
    }
}

/// Device and directory names are case-insensitive.
fn strip_prefix_ci<'a>(s: &'a str, prefix: &str) -> Option<&'a str> {
    let head = s.get(..prefix.len())?;
    head.eq_ignore_ascii_case(prefix)
        .then(|| &s[prefix.len()..])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn logged_paths_become_drive_letter_paths() {
        let paths = DevicePaths::new(
            vec![
                (r"\Device\HarddiskVolume1".into(), "D:".into()),
                (r"\Device\HarddiskVolume10".into(), "C:".into()),
            ],
            Some(r"C:\Windows".into()),
        );
        assert_eq!(
            paths.dos_path(r"\Device\HarddiskVolume10\Windows\System32\ntdll.dll"),
            r"C:\Windows\System32\ntdll.dll"
        );
        assert_eq!(
            paths.dos_path(r"\Device\HarddiskVolume1\src\prog.exe"),
            r"D:\src\prog.exe"
        );
        assert_eq!(
            paths.dos_path(r"\SystemRoot\system32\ntoskrnl.exe"),
            r"C:\Windows\system32\ntoskrnl.exe"
        );
        assert_eq!(paths.dos_path(r"\??\C:\x\y.sys"), r"C:\x\y.sys");
        assert_eq!(
            paths.dos_path(r"\Device\Mup\server\share\a.dll"),
            r"\Device\Mup\server\share\a.dll"
        );
    }
}
