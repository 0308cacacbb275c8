//! The store contract (`tests/contract/suite.rs`), run against every
//! backend: the same tests, included once per backend module, never
//! copied. The PostgreSQL module needs a cluster (`JOBQ_TEST_PG`, see
//! `scripts/pg-test.sh`); without one its tests fail, saying how to start
//! one. Each PostgreSQL test gets a database of its own.

mod sled {
    use jobq_server::{store::sled::SledStore, Config};
    use tempfile::TempDir;

    type TestStore = SledStore;

    /// Model test cases (each opens a store).
    const MODEL_CASES: u32 = 32;

    /// Where a store lives, kept for reopening.
    async fn guard() -> TempDir {
        TempDir::new().expect("temp dir")
    }

    async fn reopen(dir: &TempDir) -> SledStore {
        reopen_with(dir, |_| {}).await
    }

    /// [`reopen`], with `tweak` applied to the configuration.
    async fn reopen_with(dir: &TempDir, tweak: impl FnOnce(&mut Config)) -> SledStore {
        let mut config = Config::with_data(dir.path());
        config.backoff_base = BACKOFF.base;
        config.backoff_cap = BACKOFF.cap;
        config.cache_bytes = 8 * 1024 * 1024;
        tweak(&mut config);
        SledStore::open(&config).expect("open the store")
    }

    async fn fresh() -> (TempDir, SledStore) {
        let dir = guard().await;
        let store = reopen(&dir).await;
        (dir, store)
    }

    fn flush_rounds(store: &SledStore) -> Option<u64> {
        Some(store.flush_rounds())
    }

    include!("contract/suite.rs");
}

mod postgres {
    use jobq_server::{
        store::postgres::{testing, Clock, PgOptions, PgStore},
        Config,
    };

    type TestStore = PgStore;

    /// Model test cases: each creates a database, so fewer than sled's.
    const MODEL_CASES: u32 = 8;

    /// A fresh database's URL.
    async fn guard() -> String {
        testing::fresh_database("jobq_contract").await
    }

    /// Connects to the database at `url`, with the caller's clock: the
    /// suite replays time with `at(ms)`.
    async fn reopen(url: &str) -> PgStore {
        reopen_with(url, |_| {}).await
    }

    /// [`reopen`], with `tweak` applied to the configuration.
    async fn reopen_with(url: &str, tweak: impl FnOnce(&mut Config)) -> PgStore {
        let mut config = Config::with_data("unused");
        config.backoff_base = BACKOFF.base;
        config.backoff_cap = BACKOFF.cap;
        tweak(&mut config);
        let options = PgOptions {
            clock: Clock::Caller,
            group_commit: 1,
            ..testing::options(url)
        };
        PgStore::connect(&config, options)
            .await
            .expect("connect to the test database")
    }

    async fn fresh() -> (String, PgStore) {
        let url = guard().await;
        let store = reopen(&url).await;
        (url, store)
    }

    fn flush_rounds(_: &PgStore) -> Option<u64> {
        None
    }

    include!("contract/suite.rs");
}
