//! The plain event, read by hand (without serde).

use std::borrow::Cow;

use super::event::{Args, ArgsField, Event, EventField, Id, Seq, Text};

/// Exact powers of ten (as f64, every one up to 1e22 is).
const POW10: [f64; 23] = [
    1e0, 1e1, 1e2, 1e3, 1e4, 1e5, 1e6, 1e7, 1e8, 1e9, 1e10, 1e11, 1e12, 1e13, 1e14, 1e15, 1e16,
    1e17, 1e18, 1e19, 1e20, 1e21, 1e22,
];

/// How deep a skipped value may nest before serde is left to read it.
const QUICK_DEPTH: u32 = 32;

/// The event object at the start of `b` and its length, read without
/// serde when it has the plain shape Kineto writes; `None` for anything
/// else (an escape, a number that is not a plain decimal, a repeated
/// field, deep nesting, a wrong type, invalid JSON, or the object running
/// past `b`), which serde then reads (and says what is wrong with it).
/// What it accepts is valid JSON, read as serde reads it.
#[inline(always)]
pub(super) fn quick_event(b: &[u8]) -> Option<(Event<'_>, usize)> {
    let mut c = Cur { b, i: 0 };
    let mut ev = Event::default();
    let mut seen = [false; EventField::COUNT];
    c.object(|c, key| {
        let Some(field) = EventField::of(key) else {
            // serde reads the names of fields as text.
            return (key.is_ascii() || std::str::from_utf8(key).is_ok())
                .then(|| c.skip(1))
                .flatten();
        };
        if std::mem::replace(&mut seen[field as usize], true) {
            return None;
        }
        match field {
            EventField::Ph => c.or_null(&mut ev.ph, Cur::text)?,
            EventField::Name => c.or_null(&mut ev.name, Cur::text)?,
            EventField::Cat => c.or_null(&mut ev.cat, Cur::text)?,
            EventField::Pid => c.or_null(&mut ev.pid, Cur::id)?,
            EventField::Tid => c.or_null(&mut ev.tid, Cur::id)?,
            EventField::Ts => c.or_null(&mut ev.ts, Cur::f64)?,
            EventField::Dur => c.or_null(&mut ev.dur, Cur::f64)?,
            EventField::Args => c.or_null(&mut ev.args, Cur::args)?,
        }
        Some(())
    })?;
    Some((ev, c.i))
}

/// The bytes of `w` (little end first) that end a plain string: the high
/// bit of each that is a quote, a backslash or a control character, exact
/// for the first one.
fn string_stops(w: u64) -> u64 {
    const ONES: u64 = u64::from_ne_bytes([1; 8]);
    const HIGH: u64 = u64::from_ne_bytes([0x80; 8]);
    let quote = w ^ (ONES * u64::from(b'"'));
    let slash = w ^ (ONES * u64::from(b'\\'));
    ((quote.wrapping_sub(ONES) & !quote)
        | (slash.wrapping_sub(ONES) & !slash)
        | (w.wrapping_sub(ONES * 0x20) & !w))
        & HIGH
}

/// A number as [`Cur::number`] read it: its sign, its digits as one
/// integer (meaningful up to 19 of them), how many before and after the
/// point, and whether it has an exponent.
struct Number {
    neg: bool,
    digits: u64,
    int_len: usize,
    frac_len: usize,
    exp: bool,
}

/// A cursor over the bytes of one value.
struct Cur<'a> {
    b: &'a [u8],
    i: usize,
}

impl<'a> Cur<'a> {
    fn ws(&mut self) {
        while let Some(b' ' | b'\n' | b'\r' | b'\t') = self.b.get(self.i) {
            self.i += 1;
        }
    }

    fn peek(&self) -> Option<u8> {
        self.b.get(self.i).copied()
    }

    fn eat(&mut self, c: u8) -> Option<()> {
        (self.peek()? == c).then(|| self.i += 1)
    }

    fn literal(&mut self, lit: &[u8]) -> Option<()> {
        let end = self.i + lit.len();
        (self.b.get(self.i..end)? == lit).then(|| self.i = end)
    }

    /// A value that may be `null`: into `slot`, none for `null`, else
    /// what `f` reads (`None`, like every reading here, when it is not
    /// the plain shape).
    fn or_null<T>(
        &mut self,
        slot: &mut Option<T>,
        f: impl FnOnce(&mut Self) -> Option<T>,
    ) -> Option<()> {
        *slot = if self.peek()? == b'n' {
            self.literal(b"null")?;
            None
        } else {
            Some(f(self)?)
        };
        Some(())
    }

    /// An object (at its `{`): `field` reads each value (the cursor at
    /// it), given the key's bytes.
    fn object(&mut self, mut field: impl FnMut(&mut Self, &'a [u8]) -> Option<()>) -> Option<()> {
        self.eat(b'{')?;
        self.ws();
        if self.eat(b'}').is_some() {
            return Some(());
        }
        loop {
            let key = self.string()?;
            self.ws();
            self.eat(b':')?;
            self.ws();
            field(self, key)?;
            self.ws();
            match self.peek()? {
                b',' => {
                    self.i += 1;
                    self.ws();
                }
                b'}' => {
                    self.i += 1;
                    return Some(());
                }
                _ => return None,
            }
        }
    }

    /// A string without escapes (at its quote): its bytes.
    fn string(&mut self) -> Option<&'a [u8]> {
        let b = self.b;
        if b.get(self.i) != Some(&b'"') {
            return None;
        }
        let start = self.i + 1;
        let mut i = start;
        // Eight bytes at a time, to the first that ends the plain string
        // (a quote, a backslash or a control character).
        while let Some(w) = b.get(i..i + 8) {
            let stop = string_stops(u64::from_le_bytes(w.try_into().ok()?));
            if stop != 0 {
                i += (stop.trailing_zeros() / 8) as usize;
                break;
            }
            i += 8;
        }
        while let Some(&c) = b.get(i)
            && c != b'"'
            && c != b'\\'
            && c >= 0x20
        {
            i += 1;
        }
        if *b.get(i)? != b'"' {
            return None;
        }
        self.i = i + 1;
        Some(&b[start..i])
    }

    fn text(&mut self) -> Option<Text<'a>> {
        let s = std::str::from_utf8(self.string()?).ok()?;
        Some(Text(Cow::Borrowed(s)))
    }

    /// A number in JSON's grammar (the cursor after it), which must end
    /// before the end of what is read.
    fn number(&mut self) -> Option<Number> {
        let b = self.b;
        let mut i = self.i;
        let neg = b.get(i) == Some(&b'-');
        i += usize::from(neg);
        let mut digits = 0u64;
        let mut run = |i: &mut usize| {
            let start = *i;
            while let Some(&d @ b'0'..=b'9') = b.get(*i) {
                digits = digits.wrapping_mul(10).wrapping_add(u64::from(d - b'0'));
                *i += 1;
            }
            *i - start
        };
        let int_len = run(&mut i);
        if int_len == 0 || (int_len > 1 && b[i - int_len] == b'0') {
            return None;
        }
        let mut frac_len = 0;
        if b.get(i) == Some(&b'.') {
            i += 1;
            frac_len = run(&mut i);
            if frac_len == 0 {
                return None;
            }
        }
        let exp = matches!(b.get(i), Some(b'e' | b'E'));
        if exp {
            i += 1;
            if let Some(b'+' | b'-') = b.get(i) {
                i += 1;
            }
            let start = i;
            while let Some(b'0'..=b'9') = b.get(i) {
                i += 1;
            }
            if i == start {
                return None;
            }
        }
        b.get(i)?;
        self.i = i;
        Some(Number {
            neg,
            digits,
            int_len,
            frac_len,
            exp,
        })
    }

    /// A number as f64, when it is a plain decimal below 2^53 in all its
    /// digits: then serde's reading (significand / 10^k, exact operands)
    /// is the correctly rounded one and this is the same.
    fn f64(&mut self) -> Option<f64> {
        let n = self.number()?;
        if n.exp || n.int_len + n.frac_len > 15 {
            return None;
        }
        let f = n.digits as f64 / POW10[n.frac_len];
        Some(if n.neg { -f } else { f })
    }

    /// An integer of up to 18 digits (not `-0`, which serde reads as a
    /// float).
    fn int(&mut self) -> Option<i64> {
        let n = self.number()?;
        if n.exp || n.frac_len > 0 || n.int_len > 18 || (n.neg && n.digits == 0) {
            return None;
        }
        let m = i64::try_from(n.digits).ok()?;
        Some(if n.neg { -m } else { m })
    }

    fn unsigned(&mut self) -> Option<u64> {
        u64::try_from(self.int()?).ok()
    }

    fn id(&mut self) -> Option<Id<'a>> {
        if self.peek()? == b'"' {
            Some(Id::Text(self.text()?.0))
        } else {
            self.int().map(Id::Num)
        }
    }

    fn args(&mut self) -> Option<Args<'a>> {
        let mut args = Args::default();
        let mut seen = [false; ArgsField::COUNT];
        self.object(|c, key| {
            let Some(field) = ArgsField::of(key) else {
                return (key.is_ascii() || std::str::from_utf8(key).is_ok())
                    .then(|| c.skip(2))
                    .flatten();
            };
            if std::mem::replace(&mut seen[field as usize], true) {
                return None;
            }
            match field {
                ArgsField::Collective => c.or_null(&mut args.collective, Cur::text)?,
                ArgsField::Group => c.or_null(&mut args.group, Cur::text)?,
                ArgsField::Seq => c.or_null(&mut args.seq, Cur::seq)?,
                ArgsField::ExternalId => c.or_null(&mut args.external_id, Cur::unsigned)?,
                ArgsField::Correlation => c.or_null(&mut args.correlation, Cur::unsigned)?,
                ArgsField::InNelems => c.or_null(&mut args.in_nelems, Cur::unsigned)?,
                ArgsField::GroupSize => {
                    c.or_null(&mut args.group_size, |c| u32::try_from(c.int()?).ok())?;
                }
            }
            Some(())
        })?;
        Some(args)
    }

    fn seq(&mut self) -> Option<Seq> {
        if self.peek()? == b'"' {
            let s = std::str::from_utf8(self.string()?).ok()?;
            Some(Seq(s.trim().parse().ok()))
        } else {
            let n = self.int()?;
            Some(Seq(u64::try_from(n).ok()))
        }
    }

    /// Any value, unread (`depth`: how deep it sits).
    fn skip(&mut self, depth: u32) -> Option<()> {
        if depth > QUICK_DEPTH {
            return None;
        }
        match self.peek()? {
            b'"' => self.string().map(|_| ()),
            b'{' => self.object(|c, _| c.skip(depth + 1)),
            b'[' => {
                self.i += 1;
                self.ws();
                if self.eat(b']').is_some() {
                    return Some(());
                }
                loop {
                    self.skip(depth + 1)?;
                    self.ws();
                    match self.peek()? {
                        b',' => {
                            self.i += 1;
                            self.ws();
                        }
                        b']' => {
                            self.i += 1;
                            return Some(());
                        }
                        _ => return None,
                    }
                }
            }
            b't' => self.literal(b"true"),
            b'f' => self.literal(b"false"),
            b'n' => self.literal(b"null"),
            _ => self.number().map(|_| ()),
        }
    }
}
