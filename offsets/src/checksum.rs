//! The per-record checksum of layout v2: BLAKE2b (RFC 7693) with an 8-byte
//! digest, no key, over the record's words as little-endian bytes; the
//! digest read as a little-endian u64. Python computes the same value with
//! `hashlib.blake2b(data, digest_size=8)`, so a reader without memory
//! fences can tell a torn copy from a record the writer published
//! (docs/offsets-format.md, "Torn reads without fences").

const IV: [u64; 8] = [
    0x6a09_e667_f3bc_c908,
    0xbb67_ae85_84ca_a73b,
    0x3c6e_f372_fe94_f82b,
    0xa54f_f53a_5f1d_36f1,
    0x510e_527f_ade6_82d1,
    0x9b05_688c_2b3e_6c1f,
    0x1f83_d9ab_fb41_bd6b,
    0x5be0_cd19_137e_2179,
];

const SIGMA: [[usize; 16]; 12] = [
    [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15],
    [14, 10, 4, 8, 9, 15, 13, 6, 1, 12, 0, 2, 11, 7, 5, 3],
    [11, 8, 12, 0, 5, 2, 15, 13, 10, 14, 3, 6, 7, 1, 9, 4],
    [7, 9, 3, 1, 13, 12, 11, 14, 2, 6, 5, 10, 4, 0, 15, 8],
    [9, 0, 5, 7, 2, 4, 10, 15, 14, 1, 11, 12, 6, 8, 3, 13],
    [2, 12, 6, 10, 0, 11, 8, 3, 4, 13, 7, 5, 15, 14, 1, 9],
    [12, 5, 1, 15, 14, 13, 4, 10, 0, 7, 6, 3, 9, 2, 8, 11],
    [13, 11, 7, 14, 12, 1, 3, 9, 5, 0, 15, 4, 8, 6, 2, 10],
    [6, 15, 14, 9, 11, 3, 0, 8, 12, 2, 13, 7, 1, 4, 10, 5],
    [10, 2, 8, 4, 7, 6, 1, 5, 15, 11, 9, 14, 3, 12, 13, 0],
    [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15],
    [14, 10, 4, 8, 9, 15, 13, 6, 1, 12, 0, 2, 11, 7, 5, 3],
];

#[allow(clippy::many_single_char_names)]
fn g(v: &mut [u64; 16], a: usize, b: usize, c: usize, d: usize, x: u64, y: u64) {
    v[a] = v[a].wrapping_add(v[b]).wrapping_add(x);
    v[d] = (v[d] ^ v[a]).rotate_right(32);
    v[c] = v[c].wrapping_add(v[d]);
    v[b] = (v[b] ^ v[c]).rotate_right(24);
    v[a] = v[a].wrapping_add(v[b]).wrapping_add(y);
    v[d] = (v[d] ^ v[a]).rotate_right(16);
    v[c] = v[c].wrapping_add(v[d]);
    v[b] = (v[b] ^ v[c]).rotate_right(63);
}

fn compress(h: &mut [u64; 8], m: &[u64; 16], t: u128, last: bool) {
    let mut v = [0u64; 16];
    v[..8].copy_from_slice(h);
    v[8..].copy_from_slice(&IV);
    v[12] ^= t as u64;
    v[13] ^= (t >> 64) as u64;
    if last {
        v[14] = !v[14];
    }
    for s in &SIGMA {
        g(&mut v, 0, 4, 8, 12, m[s[0]], m[s[1]]);
        g(&mut v, 1, 5, 9, 13, m[s[2]], m[s[3]]);
        g(&mut v, 2, 6, 10, 14, m[s[4]], m[s[5]]);
        g(&mut v, 3, 7, 11, 15, m[s[6]], m[s[7]]);
        g(&mut v, 0, 5, 10, 15, m[s[8]], m[s[9]]);
        g(&mut v, 1, 6, 11, 12, m[s[10]], m[s[11]]);
        g(&mut v, 2, 7, 8, 13, m[s[12]], m[s[13]]);
        g(&mut v, 3, 4, 9, 14, m[s[14]], m[s[15]]);
    }
    for i in 0..8 {
        h[i] ^= v[i] ^ v[i + 8];
    }
}

/// BLAKE2b-64 of `bytes`, as a little-endian u64.
pub fn blake2b64(bytes: &[u8]) -> u64 {
    let mut h = IV;
    h[0] ^= 0x0101_0000 ^ 8; // depth 1, fanout 1, no key, 8-byte digest
    let blocks = bytes.len().div_ceil(128).max(1);
    for b in 0..blocks {
        let chunk = &bytes[b * 128..bytes.len().min(b * 128 + 128)];
        let mut padded = [0u8; 128];
        padded[..chunk.len()].copy_from_slice(chunk);
        let mut m = [0u64; 16];
        for (i, w) in m.iter_mut().enumerate() {
            *w = u64::from_le_bytes(padded[i * 8..i * 8 + 8].try_into().unwrap_or([0; 8]));
        }
        let last = b + 1 == blocks;
        let t = if last {
            bytes.len() as u128
        } else {
            (b as u128 + 1) * 128
        };
        compress(&mut h, &m, t, last);
    }
    h[0]
}

/// The checksum of a run of record words (their little-endian bytes).
pub fn of_words(words: &[u64]) -> u64 {
    let bytes: Vec<u8> = words.iter().flat_map(|w| w.to_le_bytes()).collect();
    blake2b64(&bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hex(s: &str) -> u64 {
        u64::from_le_bytes(
            (0..8)
                .map(|i| u8::from_str_radix(&s[2 * i..2 * i + 2], 16).unwrap())
                .collect::<Vec<_>>()
                .try_into()
                .unwrap(),
        )
    }

    #[test]
    fn matches_pythons_hashlib_blake2b_digest_size_8() {
        // python3 -c 'import hashlib; print(hashlib.blake2b(b"abc", digest_size=8).hexdigest())'
        assert_eq!(blake2b64(b""), hex("e4a6a0577479b2b4"));
        assert_eq!(blake2b64(b"abc"), hex("d8bb14d833d59559"));
        let two_blocks: Vec<u8> = (0..200u8).collect();
        assert_eq!(blake2b64(&two_blocks), hex("5bfa6575ac9a98bd"));
        let exactly_one: Vec<u8> = (0..128u8).collect();
        assert_ne!(blake2b64(&exactly_one), blake2b64(&exactly_one[..127]));
    }
}
