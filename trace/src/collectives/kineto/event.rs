//! The fields of an event that the calls need, borrowed from the file.

use std::borrow::Cow;
use std::fmt;
use std::marker::PhantomData;

use serde::Deserialize;
use serde::de::{self, IgnoredAny, MapAccess, SeqAccess, Unexpected, Visitor};

/// A thread or process id: Kineto writes numbers, and strings for its own
/// rows ("Trace PyTorch Profiler").
pub(super) enum Id<'a> {
    Num(i64),
    Text(Cow<'a, str>),
}

impl<'de: 'a, 'a> Deserialize<'de> for Id<'a> {
    fn deserialize<D: de::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V<'a>(PhantomData<&'a ()>);
        impl<'de: 'a, 'a> Visitor<'de> for V<'a> {
            type Value = Id<'a>;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a process or thread id (an integer or a string)")
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<Self::Value, E> {
                Ok(Id::Num(v))
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<Self::Value, E> {
                i64::try_from(v)
                    .map(Id::Num)
                    .map_err(|_| E::invalid_value(Unexpected::Unsigned(v), &self))
            }
            fn visit_borrowed_str<E: de::Error>(self, v: &'de str) -> Result<Self::Value, E> {
                Ok(Id::Text(Cow::Borrowed(v)))
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Self::Value, E> {
                Ok(Id::Text(Cow::Owned(v.to_owned())))
            }
            fn visit_string<E: de::Error>(self, v: String) -> Result<Self::Value, E> {
                Ok(Id::Text(Cow::Owned(v)))
            }
        }
        d.deserialize_any(V(PhantomData))
    }
}

/// An [`Id`] kept (the key of a thread).
#[derive(Clone, PartialEq, Eq, Hash)]
pub(super) enum IdKey {
    Num(i64),
    Text(Box<str>),
}

impl IdKey {
    pub(super) fn of(id: Option<&Id>) -> Option<Self> {
        id.map(|id| match id {
            Id::Num(n) => Self::Num(*n),
            Id::Text(s) => Self::Text(s.as_ref().into()),
        })
    }

    pub(super) fn is(this: Option<&Self>, id: Option<&Id>) -> bool {
        match (this, id) {
            (None, None) => true,
            (Some(Self::Num(a)), Some(Id::Num(b))) => a == b,
            (Some(Self::Text(a)), Some(Id::Text(b))) => **a == **b,
            _ => false,
        }
    }
}

/// A string of the file, borrowed unless it has escapes.
pub(super) struct Text<'a>(pub(super) Cow<'a, str>);

impl<'de: 'a, 'a> Deserialize<'de> for Text<'a> {
    fn deserialize<D: de::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V<'a>(PhantomData<&'a ()>);
        impl<'de: 'a, 'a> Visitor<'de> for V<'a> {
            type Value = Text<'a>;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a string")
            }
            fn visit_borrowed_str<E: de::Error>(self, v: &'de str) -> Result<Self::Value, E> {
                Ok(Text(Cow::Borrowed(v)))
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Self::Value, E> {
                Ok(Text(Cow::Owned(v.to_owned())))
            }
            fn visit_string<E: de::Error>(self, v: String) -> Result<Self::Value, E> {
                Ok(Text(Cow::Owned(v)))
            }
        }
        d.deserialize_str(V(PhantomData))
    }
}

impl std::ops::Deref for Text<'_> {
    type Target = str;
    fn deref(&self) -> &str {
        &self.0
    }
}

/// One element of `traceEvents`, as far as the calls need it (the rest
/// is skipped unread).
#[derive(Default, Deserialize)]
pub(super) struct Event<'a> {
    #[serde(borrow)]
    pub(super) ph: Option<Text<'a>>,
    #[serde(borrow)]
    pub(super) name: Option<Text<'a>>,
    #[serde(borrow)]
    pub(super) cat: Option<Text<'a>>,
    #[serde(borrow)]
    pub(super) pid: Option<Id<'a>>,
    #[serde(borrow)]
    pub(super) tid: Option<Id<'a>>,
    pub(super) ts: Option<f64>,
    pub(super) dur: Option<f64>,
    #[serde(borrow)]
    pub(super) args: Option<Args<'a>>,
}

/// The fields of [`Event`], as the hand reader tells them.
#[derive(Clone, Copy)]
pub(super) enum EventField {
    Ph,
    Name,
    Cat,
    Pid,
    Tid,
    Ts,
    Dur,
    Args,
}

impl EventField {
    pub(super) const COUNT: usize = 8;

    pub(super) fn of(key: &[u8]) -> Option<Self> {
        Some(match key {
            b"ph" => Self::Ph,
            b"name" => Self::Name,
            b"cat" => Self::Cat,
            b"pid" => Self::Pid,
            b"tid" => Self::Tid,
            b"ts" => Self::Ts,
            b"dur" => Self::Dur,
            b"args" => Self::Args,
            _ => return None,
        })
    }
}

/// The collective metadata PyTorch writes into an event's args.
#[derive(Default, Deserialize)]
pub(super) struct Args<'a> {
    #[serde(rename = "Collective name", borrow)]
    pub(super) collective: Option<Text<'a>>,
    #[serde(rename = "Process Group Name", borrow)]
    pub(super) group: Option<Text<'a>>,
    #[serde(rename = "Seq")]
    pub(super) seq: Option<Seq>,
    #[serde(rename = "Group size")]
    pub(super) group_size: Option<u32>,
    /// The CPU op an event belongs to (Kineto's link between a kernel,
    /// its launch and the op that issued it).
    #[serde(rename = "External id")]
    pub(super) external_id: Option<u64>,
    /// A launch's and its kernel's shared id (CUPTI/roctracer).
    #[serde(rename = "correlation")]
    pub(super) correlation: Option<u64>,
    /// Elements of the collective's input (`record_param_comms`).
    #[serde(rename = "In msg nelems")]
    pub(super) in_nelems: Option<u64>,
}

/// The fields of [`Args`], as the hand reader tells them.
#[derive(Clone, Copy)]
pub(super) enum ArgsField {
    Collective,
    Group,
    Seq,
    GroupSize,
    ExternalId,
    Correlation,
    InNelems,
}

impl ArgsField {
    pub(super) const COUNT: usize = 7;

    pub(super) fn of(key: &[u8]) -> Option<Self> {
        Some(match key {
            b"Collective name" => Self::Collective,
            b"Process Group Name" => Self::Group,
            b"Seq" => Self::Seq,
            b"Group size" => Self::GroupSize,
            b"External id" => Self::ExternalId,
            b"correlation" => Self::Correlation,
            b"In msg nelems" => Self::InNelems,
            _ => return None,
        })
    }
}

/// A `Seq` arg that is there (not null): its number, when it is an
/// unsigned integer or a string holding one.
#[derive(Clone, Copy)]
pub(super) struct Seq(pub(super) Option<u64>);

impl<'de> Deserialize<'de> for Seq {
    fn deserialize<D: de::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Seq;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a sequence number")
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<Seq, E> {
                Ok(Seq(Some(v)))
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<Seq, E> {
                Ok(Seq(u64::try_from(v).ok()))
            }
            fn visit_f64<E: de::Error>(self, _: f64) -> Result<Seq, E> {
                Ok(Seq(None))
            }
            fn visit_bool<E: de::Error>(self, _: bool) -> Result<Seq, E> {
                Ok(Seq(None))
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Seq, E> {
                Ok(Seq(v.trim().parse().ok()))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut a: A) -> Result<Seq, A::Error> {
                while a.next_element::<IgnoredAny>()?.is_some() {}
                Ok(Seq(None))
            }
            fn visit_map<A: MapAccess<'de>>(self, mut a: A) -> Result<Seq, A::Error> {
                while a.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
                Ok(Seq(None))
            }
        }
        d.deserialize_any(V)
    }
}
