//! The guest side of the `stackscope gdb` tests: builds the test kernel in `tests/guest/` (once
//! per test binary) and boots it in QEMU (software emulation, two vCPUs) with the GDB stub on a
//! loopback port or a Unix socket. A booted guest is killed when its [`Qemu`] is dropped, also
//! when a test panics.
#![allow(dead_code)]

use std::io::Read;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// What the kernel writes to the serial port once every CPU runs its work loop.
pub const RUNNING_LINE: &str = "cpus running";

/// Booting under software emulation on a loaded two-core machine can be slow; past this the
/// guest is taken as broken.
const BOOT_DEADLINE: Duration = Duration::from_secs(60);

/// The two builds of the test kernel.
#[derive(Clone, Copy, Debug)]
pub enum Kernel {
    /// `-fno-omit-frame-pointer` and no `.eh_frame`: unwound by the frame chain only.
    FramePointers,
    /// `-fomit-frame-pointer` with `.eh_frame`: unwound by CFI only.
    Cfi,
}

impl Kernel {
    /// Path of this build; builds both on first use in this test binary.
    pub fn path(self) -> PathBuf {
        static BUILT: OnceLock<PathBuf> = OnceLock::new();
        let dir = BUILT.get_or_init(|| {
            let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("guest-kernel");
            let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/guest/build.sh");
            stackscope_testkit::run(Command::new("bash").arg(script).arg(&dir));
            dir
        });
        let name = match self {
            Kernel::FramePointers => "kernel-fp.elf",
            Kernel::Cfi => "kernel-cfi.elf",
        };
        dir.join(name)
    }
}

/// Where QEMU serves its GDB stub.
pub enum Stub {
    /// A loopback TCP port, picked free.
    Tcp,
    /// A Unix socket at this path.
    Unix(PathBuf),
}

/// A booted guest. `remote` is what `stackscope gdb --remote` takes.
pub struct Qemu {
    child: Child,
    pub remote: String,
    pub serial: PathBuf,
    stderr: PathBuf,
}

impl Qemu {
    /// Boots `kernel` with `cpus` vCPUs, files (serial log, QEMU's stderr) in `dir`, and waits
    /// until every vCPU runs the work loop.
    pub fn boot(kernel: Kernel, cpus: u32, stub: Stub, dir: &Path) -> Qemu {
        // A port found free may be taken before QEMU binds it: then QEMU exits at once, and
        // another port is tried.
        for _ in 0..5 {
            let (args, remote) = match &stub {
                Stub::Tcp => {
                    let port = free_port();
                    (
                        vec!["-gdb".to_string(), format!("tcp:127.0.0.1:{port}")],
                        format!("127.0.0.1:{port}"),
                    )
                }
                Stub::Unix(path) => (
                    vec![
                        "-chardev".to_string(),
                        format!("socket,path={},server=on,wait=off,id=gdb0", path.display()),
                        "-gdb".to_string(),
                        "chardev:gdb0".to_string(),
                    ],
                    path.display().to_string(),
                ),
            };
            let serial = dir.join("serial.log");
            let stderr = dir.join("qemu.stderr");
            let _ = std::fs::remove_file(&serial);
            let child = Command::new("qemu-system-x86_64")
                .args(["-accel", "tcg", "-smp", &cpus.to_string(), "-m", "64"])
                .args(["-display", "none", "-nic", "none", "-no-reboot"])
                .arg("-serial")
                .arg(format!("file:{}", serial.display()))
                .arg("-kernel")
                .arg(kernel.path())
                .args(&args)
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(std::fs::File::create(&stderr).expect("create qemu.stderr"))
                .spawn()
                .expect("cannot start qemu-system-x86_64 (scripts/install-deps.sh installs it)");
            let mut qemu = Qemu {
                child,
                remote,
                serial,
                stderr,
            };
            match qemu.wait_running() {
                Ok(()) => return qemu,
                Err(why) if why.contains("in use") && matches!(stub, Stub::Tcp) => continue,
                Err(why) => panic!("{why}"),
            }
        }
        panic!("QEMU found no free port for its GDB stub in 5 tries");
    }

    /// Waits for [`RUNNING_LINE`] on the serial port; an error says why it never came.
    fn wait_running(&mut self) -> Result<(), String> {
        let start = Instant::now();
        loop {
            let log = std::fs::read_to_string(&self.serial).unwrap_or_default();
            if log.contains(RUNNING_LINE) {
                return Ok(());
            }
            if let Some(status) = self.child.try_wait().expect("wait for qemu") {
                return Err(format!(
                    "QEMU exited ({status}) before the guest ran; stderr: {}; serial: {log}",
                    self.stderr_text()
                ));
            }
            if start.elapsed() > BOOT_DEADLINE {
                return Err(format!(
                    "the guest did not print {RUNNING_LINE:?} within {BOOT_DEADLINE:?}; serial: {log:?}; stderr: {}",
                    self.stderr_text()
                ));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn stderr_text(&self) -> String {
        let mut text = String::new();
        if let Ok(mut f) = std::fs::File::open(&self.stderr) {
            let _ = f.read_to_string(&mut text);
        }
        text.trim().to_string()
    }

    /// QEMU's pid, to kill it from outside mid-run.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Kills QEMU now and reaps it.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Qemu {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A loopback TCP port nobody listens on right now.
fn free_port() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind a loopback port");
    listener.local_addr().expect("local address").port()
}
