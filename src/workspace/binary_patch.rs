//! A binary file's part of a patch in git's own form (`git diff --binary --full-index`), which
//! `git apply` takes: an `index` line of both blobs' full ids (git checks the file it patches
//! against the first), then `GIT binary patch` with the new contents and the old (for `-R`),
//! each zlib-deflated and written in git's base85 lines.

use std::io::Write;

/// git's base85 alphabet (RFC 1924's).
const ALPHABET: &[u8; 85] = b"0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz!#$%&()*+-;<=>?@^_`{|}~";

/// The bytes one base85 line holds at most.
const LINE: usize = 52;

/// git's id of a blob of `data` (SHA-1 of `blob <len>\0<data>`), in hex.
pub fn blob_id(data: &[u8]) -> String {
    use sha1::Digest;
    let mut h = sha1::Sha1::new();
    h.update(format!("blob {}\0", data.len()).as_bytes());
    h.update(data);
    hex::encode(h.finalize())
}

/// The id git writes for a side that is not there.
const NONE: &str = "0000000000000000000000000000000000000000";

/// `data` deflated and written as `literal <len>` and git's base85 lines: each line starts with
/// its byte count (`A`–`Z` for 1–26, `a`–`z` for 27–52), then 5 characters per 4 bytes (the
/// last group padded with zeros).
fn literal(data: &[u8]) -> String {
    let mut z = flate2::write::ZlibEncoder::new(Vec::new(), flate2::Compression::default());
    z.write_all(data).expect("writing to memory");
    let deflated = z.finish().expect("writing to memory");
    let mut out = format!("literal {}\n", data.len());
    for line in deflated.chunks(LINE) {
        let n = line.len();
        out.push(if n <= 26 { (b'A' + n as u8 - 1) as char } else { (b'a' + n as u8 - 27) as char });
        for group in line.chunks(4) {
            let mut word = [0u8; 4];
            word[..group.len()].copy_from_slice(group);
            let mut acc = u32::from_be_bytes(word);
            let mut chars = [0u8; 5];
            for c in chars.iter_mut().rev() {
                *c = ALPHABET[(acc % 85) as usize];
                acc /= 85;
            }
            out.push_str(std::str::from_utf8(&chars).expect("the alphabet is ASCII"));
        }
        out.push('\n');
    }
    out.push('\n');
    out
}

/// The part after a binary file's `diff --git` and mode lines: from `old` (`None` where the file
/// is added) to `new` (`None` where it is deleted). `mode`: the file's mode where both sides have
/// the same one (git names it on the `index` line then).
pub fn section(old: Option<&[u8]>, new: Option<&[u8]>, mode: Option<&str>) -> String {
    let id = |d: Option<&[u8]>| d.map_or_else(|| NONE.to_string(), blob_id);
    let mode = mode.map(|m| format!(" {m}")).unwrap_or_default();
    format!(
        "index {}..{}{mode}\nGIT binary patch\n{}{}",
        id(old),
        id(new),
        literal(new.unwrap_or_default()),
        literal(old.unwrap_or_default())
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;

    /// A literal's bytes back, as `git apply` reads them: each line's count, base85, inflate.
    fn read_back(l: &str) -> Vec<u8> {
        let mut lines = l.lines();
        let len: usize = lines.next().unwrap().strip_prefix("literal ").unwrap().parse().unwrap();
        let mut deflated = vec![];
        for line in lines.take_while(|x| !x.is_empty()) {
            let c = line.as_bytes()[0];
            let n = if c.is_ascii_uppercase() { c - b'A' + 1 } else { c - b'a' + 27 } as usize;
            let mut bytes = vec![];
            for group in line.as_bytes()[1..].chunks(5) {
                let acc =
                    group.iter().fold(0u64, |a, ch| a * 85 + ALPHABET.iter().position(|x| x == ch).unwrap() as u64);
                bytes.extend_from_slice(&(acc as u32).to_be_bytes());
            }
            assert_eq!(line.len(), 1 + n.div_ceil(4) * 5, "{line}");
            deflated.extend_from_slice(&bytes[..n]);
        }
        let mut out = vec![];
        flate2::read::ZlibDecoder::new(deflated.as_slice()).read_to_end(&mut out).unwrap();
        assert_eq!(out.len(), len);
        out
    }

    #[test]
    fn ids_are_gits_and_literals_read_back_line_by_line() {
        // `git hash-object` of an empty file and of "hello\n".
        assert_eq!(blob_id(b""), "e69de29bb2d1d6434b8b29ae775ad8c2e48c5391");
        assert_eq!(blob_id(b"hello\n"), "ce013625030ba8dba906f756967f9e9ca394464a");
        // Random-looking bytes deflate to several full lines of 52 bytes (`z`) and a shorter last.
        let noisy: Vec<u8> = (0..400u32).map(|i| (i.wrapping_mul(2654435761) >> 13) as u8).collect();
        for data in [&b""[..], b"\0", b"\0\x01\x02\xff", &noisy] {
            let l = literal(data);
            assert_eq!(read_back(&l), data);
        }
        let lines: Vec<String> = literal(&noisy).lines().skip(1).filter(|x| !x.is_empty()).map(String::from).collect();
        assert!(lines.len() > 1 && lines[..lines.len() - 1].iter().all(|x| x.starts_with('z') && x.len() == 66));
        // An added file: the old side's id is git's none; an edited one names its mode.
        let added = section(None, Some(b"\0"), None);
        assert!(added.starts_with(&format!("index {NONE}..{}\nGIT binary patch\nliteral 1\n", blob_id(b"\0"))));
        assert!(section(Some(b""), Some(b"\0"), Some("100644")).starts_with(&format!(
            "index {}..{} 100644\n",
            blob_id(b""),
            blob_id(b"\0")
        )));
    }
}
