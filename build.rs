//! The migrations are embedded at compile time (`embed_migrations!`): a new or changed one
//! rebuilds the crate, as diesel's guide recommends, rather than leaving a build without it.
fn main() {
    println!("cargo:rerun-if-changed=migrations");
}
