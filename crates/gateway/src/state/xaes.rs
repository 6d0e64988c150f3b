//! XAES-256-GCM (C2SP) on aws-lc's AES: the cipher under every sealed token.
//!
//! The construction, per message with a 24-byte nonce `N`:
//!
//! ```text
//!  L   = AES-256(K, 0^128)                      once per ring key
//!  K1  = L << 1, xor 0x87 into the last byte when L's top bit was set
//!  Kx  = AES-256(K, (0x00 0x01 'X' 0x00 ‖ N[..12]) ⊕ K1)
//!      ‖ AES-256(K, (0x00 0x02 'X' 0x00 ‖ N[..12]) ⊕ K1)
//!  out = AES-256-GCM(Kx, nonce = N[12..], plaintext, aad)
//! ```
//!
//! The derivation's two blocks go through one ECB call under the ring key (expanded once);
//! the bulk runs through aws-lc's AES-256-GCM, which uses the widest AES and carry-less
//! multiply instructions the CPU has. Tokens are byte-compatible with any other XAES-256-GCM
//! implementation: the unit tests check the C2SP vectors.

use aws_lc_rs::aead::{AES_256_GCM, Aad, LessSafeKey, Nonce, Tag, UnboundKey};
use aws_lc_rs::cipher::{AES_256, EncryptingKey, UnboundCipherKey};

pub const NONCE_LEN: usize = 24;
pub const TAG_LEN: usize = 16;

/// One ring key, ready to seal and open.
pub struct Xaes {
    /// AES-256 under the ring key, for the two derivation blocks.
    ecb: EncryptingKey,
    /// The CMAC-style subkey `K1`.
    k1: [u8; 16],
}

impl Xaes {
    pub fn new(secret: &[u8; 32]) -> Xaes {
        let ecb = EncryptingKey::ecb(
            UnboundCipherKey::new(&AES_256, secret).expect("AES-256 takes a 32-byte key"),
        )
        .expect("AES-256 supports ECB");
        let mut l = [0u8; 16];
        ecb.encrypt(&mut l).expect("one whole block");
        let mut k1 = [0u8; 16];
        for i in 0..16 {
            k1[i] = (l[i] << 1) | l.get(i + 1).map_or(0, |next| next >> 7);
        }
        if l[0] & 0x80 != 0 {
            k1[15] ^= 0x87;
        }
        Xaes { ecb, k1 }
    }

    /// The per-message AES-256-GCM key for `nonce`, and the 12-byte GCM nonce.
    fn message_key(&self, nonce: &[u8; NONCE_LEN]) -> (LessSafeKey, Nonce) {
        let mut blocks = [0u8; 32];
        for (i, block) in blocks.chunks_exact_mut(16).enumerate() {
            block[..4].copy_from_slice(&[0x00, i as u8 + 1, b'X', 0x00]);
            block[4..].copy_from_slice(&nonce[..12]);
            for (b, k) in block.iter_mut().zip(self.k1) {
                *b ^= k;
            }
        }
        self.ecb.encrypt(&mut blocks).expect("two whole blocks");
        let key = LessSafeKey::new(
            UnboundKey::new(&AES_256_GCM, &blocks).expect("a 32-byte AES-256-GCM key"),
        );
        let gcm_nonce: [u8; 12] = nonce[12..].try_into().expect("24 - 12 bytes");
        (key, Nonce::assume_unique_for_key(gcm_nonce))
    }

    /// Encrypts `in_out` in place and returns the tag.
    pub fn seal_in_place(&self, nonce: &[u8; NONCE_LEN], aad: &[u8], in_out: &mut [u8]) -> Tag {
        let (key, n) = self.message_key(nonce);
        key.seal_in_place_separate_tag(n, Aad::from(aad), in_out)
            .expect("AES-256-GCM cannot fail below its 64 GiB limit")
    }

    /// Checks and decrypts `ciphertext ‖ tag` in place; the plaintext is the returned prefix.
    pub fn open_in_place<'a>(
        &self,
        nonce: &[u8; NONCE_LEN],
        aad: &[u8],
        in_out: &'a mut [u8],
    ) -> Option<&'a mut [u8]> {
        let (key, n) = self.message_key(nonce);
        key.open_in_place(n, Aad::from(aad), in_out).ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hex(b: &[u8]) -> String {
        b.iter().map(|x| format!("{x:02x}")).collect()
    }

    /// Seals `msg` and returns `ciphertext ‖ tag` as hex.
    fn seal_hex(key: u8, msg: &[u8], aad: &[u8]) -> String {
        let x = Xaes::new(&[key; 32]);
        let mut buf = msg.to_vec();
        let tag = x.seal_in_place(b"ABCDEFGHIJKLMNOPQRSTUVWX", aad, &mut buf);
        buf.extend_from_slice(tag.as_ref());
        hex(&buf)
    }

    #[test]
    fn matches_the_c2sp_vectors() {
        // The two published XAES-256-GCM vectors (c2sp.org/XAES-256-GCM).
        assert_eq!(
            seal_hex(1, b"XAES-256-GCM", b""),
            "ce546ef63c9cc60765923609b33a9a1974e96e52daf2fcf7075e2271"
        );
        assert_eq!(
            seal_hex(3, b"XAES-256-GCM", b"c2sp.org/XAES-256-GCM"),
            "986ec1832593df5443a179437fd083bf3fdb41abd740a21f71eb769d"
        );
    }

    #[test]
    fn agrees_with_the_rustcrypto_implementation_both_ways() {
        use xaes_256_gcm::Xaes256Gcm;
        use xaes_256_gcm::aead::{Aead, KeyInit, Payload};
        // Keys whose L has its top bit set and clear both occur among these, so both branches
        // of the K1 derivation are exercised.
        for key in 0u8..16 {
            let ours = Xaes::new(&[key; 32]);
            let theirs = Xaes256Gcm::new(&[key; 32].into());
            let nonce = [key.wrapping_mul(31); NONCE_LEN];
            let msg: Vec<u8> = (0..1000u32).map(|i| (i * 7 + key as u32) as u8).collect();
            let sealed = theirs
                .encrypt(
                    (&nonce).into(),
                    Payload {
                        msg: &msg,
                        aad: b"ad",
                    },
                )
                .unwrap();
            let mut buf = sealed.clone();
            assert_eq!(
                ours.open_in_place(&nonce, b"ad", &mut buf).unwrap(),
                &msg[..]
            );
            let mut buf = msg.clone();
            let tag = ours.seal_in_place(&nonce, b"ad", &mut buf);
            buf.extend_from_slice(tag.as_ref());
            assert_eq!(buf, sealed);
        }
    }

    #[test]
    fn both_k1_branches_are_covered() {
        let top_bits: Vec<bool> = (0u8..16)
            .map(|key| {
                let x = Xaes::new(&[key; 32]);
                let mut l = [0u8; 16];
                x.ecb.encrypt(&mut l).unwrap();
                l[0] & 0x80 != 0
            })
            .collect();
        assert!(top_bits.contains(&true) && top_bits.contains(&false));
    }

    #[test]
    fn a_flipped_bit_or_other_aad_does_not_open() {
        let x = Xaes::new(&[9; 32]);
        let nonce = [5u8; NONCE_LEN];
        let mut buf = b"answers".to_vec();
        let tag = x.seal_in_place(&nonce, b"a", &mut buf);
        buf.extend_from_slice(tag.as_ref());
        assert!(x.open_in_place(&nonce, b"b", &mut buf.clone()).is_none());
        for i in 0..buf.len() {
            let mut bad = buf.clone();
            bad[i] ^= 1;
            assert!(
                x.open_in_place(&nonce, b"a", &mut bad).is_none(),
                "byte {i}"
            );
        }
        let mut other_nonce = nonce;
        other_nonce[0] ^= 1;
        assert!(
            x.open_in_place(&other_nonce, b"a", &mut buf.clone())
                .is_none()
        );
    }
}
