//! rust_allocs's sites and account on tikv-jemallocator instead of the system allocator:
//! `Vec::with_capacity` calls `_rjem_malloc`, `vec![0; n]` `_rjem_calloc`, a grown vector
//! `_rjem_realloc` and a drop `_rjem_sdallocx`.
//! usage: jemalloc_allocs SEED CALLS

#[global_allocator]
static JEMALLOC: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

#[path = "../../rust_allocs.rs"]
mod allocs;

fn main() {
    allocs::main();
}
