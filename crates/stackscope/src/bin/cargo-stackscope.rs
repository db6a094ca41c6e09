//! `cargo-stackscope`: `cargo stackscope` builds a target with debug info and profiles it.

fn main() {
    stackscope::cargo::main()
}
