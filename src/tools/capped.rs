//! A reader that fails once more than a cap has come out of it: an archive's decoder, so that a
//! small compressed input that inflates to gigabytes stops at the cap (workspaces' uploads,
//! images' layers).

use std::io::Read;

/// The error's text: what `is_over` recognises through the wrappings of a tar reader.
const OVER: &str = "uncompressed size over the cap";

/// Counts what `inner` gives and fails past `max`.
pub struct Capped<R> {
    pub inner: R,
    pub read: u64,
    pub max: u64,
}

impl<R> Capped<R> {
    pub fn new(inner: R, max: u64) -> Capped<R> {
        Capped { inner, read: 0, max }
    }
}

impl<R: Read> Read for Capped<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.read += n as u64;
        if self.read > self.max {
            return Err(std::io::Error::other(OVER));
        }
        Ok(n)
    }
}

/// Whether `e` is a `Capped` reader's refusal (however a reader above it wrapped it).
pub fn is_over(e: &std::io::Error) -> bool {
    e.to_string().contains(OVER)
}
