//! The README's producer and worker snippets are the examples under
//! `examples/`, which `cargo test` compiles: this keeps the two the same,
//! so the README never shows code that does not build.

fn read(rel: &str) -> String {
    let path = format!("{}/{rel}", env!("CARGO_MANIFEST_DIR"));
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"))
}

#[test]
fn the_readme_shows_the_examples_verbatim() {
    let readme = read("../../README.md");
    for example in ["examples/producer.rs", "examples/worker.rs"] {
        let code = read(example);
        let block = format!("```rust\n{code}```\n");
        assert!(
            readme.contains(&block),
            "README.md does not show crates/client/{example} verbatim; copy it over"
        );
    }
}
