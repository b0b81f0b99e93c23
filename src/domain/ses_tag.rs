//! Herald's event id as an Amazon SES message-tag value.
//!
//! SES documents tag values as ASCII letters, digits, `_` and `-`, at most 256 characters. An
//! event id may hold any visible ASCII character (`order-42:placed`), so it travels encoded:
//! letters, digits and `-` stand for themselves; every other byte, `_` included, is `_` followed
//! by its two upper-case hex digits (`:` → `_3A`, `_` → `_5F`). The encoding is injective, so
//! [`decode`] gives back exactly the id [`encode`] was given. Both sides live here: the email
//! channel encodes, the SES normalizer decodes.

/// The longest tag value SES accepts.
pub const MAX_LEN: usize = 256;

/// The tag value for `event_id`, or `None` when the encoded form exceeds [`MAX_LEN`].
pub fn encode(event_id: &str) -> Option<String> {
    let mut out = String::with_capacity(event_id.len());
    for b in event_id.bytes() {
        if b.is_ascii_alphanumeric() || b == b'-' {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("_{b:02X}"));
        }
    }
    (out.len() <= MAX_LEN).then_some(out)
}

/// The event id a tag value stands for. A value that is not in Herald's encoding (a `_` not
/// followed by two upper-case hex digits, a character SES would not allow, bytes that are not
/// UTF-8) is returned as it is: a tag set by someone else keeps its meaning.
pub fn decode(value: &str) -> String {
    try_decode(value).unwrap_or_else(|| value.to_owned())
}

fn try_decode(value: &str) -> Option<String> {
    let bytes = value.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'_' => {
                let hex = bytes.get(i + 1..i + 3)?;
                if !hex
                    .iter()
                    .all(|h| h.is_ascii_digit() || (b'A'..=b'F').contains(h))
                {
                    return None;
                }
                let byte = u8::from_str_radix(std::str::from_utf8(hex).ok()?, 16).ok()?;
                // Herald escapes only what it must, and only visible ASCII: `order_2026` (a tag
                // someone else wrote) or an escaped control byte is not Herald's encoding.
                if byte.is_ascii_alphanumeric() || byte == b'-' || !(0x21..=0x7e).contains(&byte) {
                    return None;
                }
                out.push(byte);
                i += 3;
            }
            b if b.is_ascii_alphanumeric() || b == b'-' => {
                out.push(b);
                i += 1;
            }
            _ => return None,
        }
    }
    String::from_utf8(out).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_visible_ascii_id_round_trips_in_the_allowed_alphabet() {
        let all: String = (0x21u8..=0x7e).map(char::from).collect();
        for id in [
            "order-42",
            "order-42:placed",
            "a_b",
            "reservation_17:reminder:2026-12-01T09:00Z",
            "x@y.example/%2F",
            all.as_str(),
        ] {
            let tag = encode(id).unwrap();
            assert!(
                tag.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-'),
                "{tag}"
            );
            assert_eq!(decode(&tag), id);
        }
        assert_eq!(encode("order-42:placed").unwrap(), "order-42_3Aplaced");
        assert_eq!(encode("a_b").unwrap(), "a_5Fb");
    }

    #[test]
    fn too_long_encodings_are_refused_and_foreign_values_kept() {
        assert_eq!(encode(&"a".repeat(256)).map(|t| t.len()), Some(256));
        assert_eq!(encode(&"a".repeat(257)), None);
        assert_eq!(encode(&":".repeat(86)), None, "86 × 3 = 258 characters");
        // Not Herald's encoding: kept as they are.
        for foreign in [
            "order_1",
            "a_zz",
            "a_3a",
            "tail_4",
            "has space",
            "order_2026",
            "inv_1A",
            "x_41",
            "y_2D",
            "z_7F",
            "w_20",
        ] {
            assert_eq!(decode(foreign), foreign);
        }
    }
}
