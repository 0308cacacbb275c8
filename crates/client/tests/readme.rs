//! The code that README.md and the book show is code that builds: the
//! README's quick start is `examples/quickstart.rs` (and the Python
//! client's `examples/quickstart.py`) copied verbatim, and the book's client
//! chapters pull their examples in with mdBook's `{{#include}}`. `cargo
//! test` compiles the Rust examples (and CI type-checks the Python ones with
//! `mypy --strict`); this test keeps the README and the book pointing at
//! them.

fn read(rel: &str) -> String {
    let path = format!("{}/{rel}", env!("CARGO_MANIFEST_DIR"));
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"))
}

#[test]
fn the_readme_shows_the_quick_start_verbatim() {
    let readme = read("../../README.md");
    for (example, lang) in [
        ("examples/quickstart.rs", "rust"),
        ("../../clients/python/examples/quickstart.py", "python"),
    ] {
        let code = read(example);
        let block = format!("```{lang}\n{code}```\n");
        assert!(
            readme.contains(&block),
            "README.md does not show {example} (from crates/client) verbatim; copy it over"
        );
    }
}

#[test]
fn the_book_includes_the_examples() {
    for (chapter, examples) in [
        (
            "../../docs/src/rust-client.md",
            &[
                "quickstart.rs",
                "producer.rs",
                "worker.rs",
                "email_worker.rs",
            ][..],
        ),
        (
            "../../docs/src/python-client.md",
            &[
                "confirmation_producer.py",
                "confirmation_worker.py",
                "quickstart.py",
                "worker.py",
            ][..],
        ),
    ] {
        let text = read(chapter);
        for example in examples {
            let dir = if example.ends_with(".rs") {
                "crates/client/examples"
            } else {
                "clients/python/examples"
            };
            let include = format!("{{{{#include ../../{dir}/{example}}}}}");
            assert!(
                text.contains(&include),
                "{chapter} no longer includes {dir}/{example}: show it with `{include}`"
            );
            assert!(
                std::path::Path::new(&format!(
                    "{}/../../{dir}/{example}",
                    env!("CARGO_MANIFEST_DIR")
                ))
                .is_file(),
                "{dir}/{example} is gone, but {chapter} includes it"
            );
        }
    }
}
