use std::process::{Child, Command};

use std::os::fd::{AsFd, AsRawFd};

use crate::unwind_table::TableCache;
use libbpf_rs::{MapHandle, MapType};
use stackscope_process::maps::read_proc_maps;

use super::entries::row_bytes;
use super::*;

/// Real kernel maps shaped as unwind.bpf.h declares them, room for `tables` files' tables.
struct Maps {
    tables: MapHandle,
    mappings: MapHandle,
    procs: MapHandle,
}

impl Maps {
    fn new(tables: u32) -> Self {
        let mmapable = libbpf_sys::bpf_map_create_opts {
            sz: std::mem::size_of::<libbpf_sys::bpf_map_create_opts>() as _,
            map_flags: libbpf_sys::BPF_F_MMAPABLE,
            ..Default::default()
        };
        let plain = libbpf_sys::bpf_map_create_opts {
            sz: std::mem::size_of::<libbpf_sys::bpf_map_create_opts>() as _,
            ..Default::default()
        };
        let create = |t, name: &str, value, n, opts| {
            MapHandle::create(t, Some(name), 4, value, n, opts)
                .unwrap_or_else(|e| panic!("cannot create BPF map {name} (needs root): {e}"))
        };
        // The outer map is made from a template inner map of the walker's flags.
        let inner_flags = libbpf_sys::bpf_map_create_opts {
            map_flags: libbpf_sys::BPF_F_MMAPABLE | libbpf_sys::BPF_F_INNER_MAP,
            ..mmapable
        };
        let inner = create(MapType::Array, "unwind_file", 8, 1, &inner_flags);
        let outer = libbpf_sys::bpf_map_create_opts {
            inner_map_fd: inner.as_fd().as_raw_fd() as u32,
            ..plain
        };
        Maps {
            tables: create(MapType::ArrayOfMaps, "unwind_tables", 4, tables, &outer),
            mappings: create(MapType::Array, "unwind_mappings", 32, 1024, &mmapable),
            procs: create(MapType::Hash, "unwind_procs", 8, 64, &plain),
        }
    }

    fn table_maps(&self) -> TableMaps<'_> {
        TableMaps {
            tables: &self.tables,
            mappings: &self.mappings,
            procs: &self.procs,
        }
    }

    fn proc(&self, pid: u32) -> Option<(u32, u32)> {
        let v = self
            .procs
            .lookup(&pid.to_ne_bytes(), MapFlags::ANY)
            .unwrap()?;
        Some((
            u32::from_ne_bytes(v[..4].try_into().unwrap()),
            u32::from_ne_bytes(v[4..].try_into().unwrap()),
        ))
    }

    /// A mapping entry, read back through the kernel (not through our mmap).
    fn mapping(&self, i: u32) -> (u64, u64, u64, u32, u32) {
        let v = self
            .mappings
            .lookup(&i.to_ne_bytes(), MapFlags::ANY)
            .unwrap()
            .unwrap();
        let u64_at = |o: usize| u64::from_ne_bytes(v[o..o + 8].try_into().unwrap());
        let u32_at = |o: usize| u32::from_ne_bytes(v[o..o + 4].try_into().unwrap());
        (u64_at(0), u64_at(8), u64_at(16), u32_at(24), u32_at(28))
    }

    /// Row `i` of the table in slot `table`, read back through the kernel.
    fn row(&self, table: u32, i: u32) -> Vec<u8> {
        let id = self
            .tables
            .lookup(&table.to_ne_bytes(), MapFlags::ANY)
            .unwrap()
            .expect("a table in the slot");
        let id = u32::from_ne_bytes(id[..4].try_into().unwrap());
        let rows = MapHandle::from_map_id(id).unwrap();
        rows.lookup(&i.to_ne_bytes(), MapFlags::ANY)
            .unwrap()
            .unwrap()
    }
}

/// A sleeping process; killed on drop.
struct Sleeper(Child);

impl Sleeper {
    fn start() -> Self {
        let child = Command::new("sleep").arg("60").spawn().unwrap();
        // Wait for exec and for the dynamic loader to map libc.
        let exe = std::fs::canonicalize("/proc/self/exe").unwrap();
        for _ in 0..2000 {
            let execed =
                std::fs::read_link(format!("/proc/{}/exe", child.id())).is_ok_and(|p| p != exe);
            let maps = read_proc_maps(child.id()).unwrap_or_default();
            if execed && maps.iter().any(|m| m.path.contains("libc")) {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        Sleeper(child)
    }

    fn pid(&self) -> u32 {
        self.0.id()
    }

    fn maps(&self) -> AddressSpace {
        read_proc_maps(self.pid()).unwrap()
    }
}

impl Drop for Sleeper {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn process_tables_land_in_the_maps_and_are_shared() {
    let maps = Maps::new(64);
    let tm = maps.table_maps();
    let mut loader = TableLoader::new(&tm).unwrap();
    let (a, b) = (Sleeper::start(), Sleeper::start());

    let stats = loader.load_process(&tm, a.pid(), &a.maps()).unwrap();
    assert!(stats.did_not_fit.is_empty(), "{stats:?}");
    assert!(stats.with_table >= 3, "sleep, libc, ld.so: {stats:?}");
    assert!(stats.rows_written > 1000, "{stats:?}");
    assert_eq!(stats.rows_in_use, stats.rows_written);

    // The entries say, through the kernel, what the tables of this process say.
    let (first, count) = maps.proc(a.pid()).expect("pid in unwind_procs");
    let expected = TableCache::new().process(a.pid(), &a.maps());
    assert_eq!(count as usize, expected.mappings.len());
    for (i, want) in expected.mappings.iter().enumerate() {
        let (start, end, bias, slot, row_count) = maps.mapping(first + i as u32);
        assert_eq!((start, end), (want.start, want.end), "{}", want.path);
        let Some((_, table)) = &want.table else {
            assert_eq!(row_count, 0, "{} has no table", want.path);
            continue;
        };
        assert_eq!(bias, want.bias, "{}", want.path);
        assert_eq!(row_count as usize, table.rows().len(), "{}", want.path);
        for (k, row) in table.rows().iter().enumerate() {
            assert_eq!(
                maps.row(slot, k as u32),
                row_bytes(row),
                "{} row {k}",
                want.path
            );
        }
    }
    let starts: Vec<u64> = (0..count).map(|i| maps.mapping(first + i).0).collect();
    assert!(
        starts.windows(2).all(|w| w[0] < w[1]),
        "mappings sorted by start"
    );

    // The same files in a second process: nothing new written.
    let again = loader.load_process(&tm, b.pid(), &b.maps()).unwrap();
    assert_eq!(again.rows_written, 0, "{again:?}");
    assert_eq!(again.rows_in_use, stats.rows_in_use);
    assert_eq!(again.tables_in_use, stats.tables_in_use);
    // Reloading a process rewrites its entries, not its tables.
    let reload = loader.load_process(&tm, a.pid(), &a.maps()).unwrap();
    assert_eq!(reload.rows_written, 0);
    assert!(maps.proc(a.pid()).is_some());

    loader.forget_process(&tm, a.pid()).unwrap();
    assert_eq!(maps.proc(a.pid()), None);
    assert!(maps.proc(b.pid()).is_some());
}

#[test]
fn tables_that_do_not_fit_are_counted_and_walked_by_frame_pointers() {
    // Room for one file's table: the program's own (it has the lowest addresses), not libc's
    // nor the dynamic loader's.
    let maps = Maps::new(1);
    let tm = maps.table_maps();
    let mut loader = TableLoader::new(&tm).unwrap();
    let a = Sleeper::start();
    let stats = loader.load_process(&tm, a.pid(), &a.maps()).unwrap();
    assert!(
        stats.did_not_fit.iter().any(|p| p.contains("libc")),
        "{stats:?}"
    );
    assert_eq!((stats.with_table, stats.tables_in_use), (1, 1), "{stats:?}");
    let (first, count) = maps.proc(a.pid()).unwrap();
    let libc = a
        .maps()
        .iter()
        .position(|m| m.path.contains("libc"))
        .unwrap() as u32;
    assert!(libc < count);
    assert_eq!(
        maps.mapping(first + libc).4,
        0,
        "libc: no rows, frame pointers"
    );
    // The recording's count: each refused file once, with its rows and the reason.
    let not_loaded = loader.not_loaded().clone();
    let libc_rows = TableCache::new()
        .process(a.pid(), &a.maps())
        .mappings
        .iter()
        .find(|m| m.path.contains("libc"))
        .and_then(|m| Some(m.table.as_ref()?.1.rows().len()))
        .unwrap();
    assert_eq!(
        not_loaded.files.len(),
        stats.did_not_fit.len(),
        "{not_loaded:?}"
    );
    assert!(
        not_loaded
            .files
            .iter()
            .any(|(p, rows)| p.contains("libc") && *rows == libc_rows),
        "{not_loaded:?}"
    );
    assert!(
        not_loaded.reason.contains("at most 1 files"),
        "{not_loaded:?}"
    );

    // Gone processes leave their tables for the next one, dropped as room is needed.
    loader.forget_process(&tm, a.pid()).unwrap();
    drop(a);
    let b = Sleeper::start();
    let again = loader.load_process(&tm, b.pid(), &b.maps()).unwrap();
    assert!(
        again.did_not_fit.iter().any(|p| p.contains("libc")),
        "{again:?}"
    );
    assert_eq!(again.with_table, stats.with_table, "{again:?}");
    assert_eq!(
        again.rows_written, 0,
        "the program's table was kept: {again:?}"
    );
    assert!(again.to_string().contains("did not fit: "), "{again}");
    assert_eq!(
        loader.not_loaded().files.len(),
        not_loaded.files.len(),
        "counted once"
    );
}

#[test]
fn maps_of_another_layout_are_refused() {
    let maps = Maps::new(16);
    let wrong = TableMaps {
        tables: &maps.mappings,
        mappings: &maps.mappings,
        procs: &maps.procs,
    };
    let err = TableLoader::new(&wrong).err().expect("refused");
    assert!(err.to_string().contains("unwind_tables"), "{err}");
}
