//! The `stackscope` command.

fn main() {
    stackscope::main()
}
