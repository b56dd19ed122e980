//! Field numbers of `proto/proto/xplane.proto`, named in one place for the
//! wire-level reader and writer (the merge walks the protobuf wire format
//! and never decodes whole messages). A change to the schema is a change
//! here.

pub mod xspace {
    pub const PLANES: u32 = 1;
    pub const HOSTNAMES: u32 = 4;
}

pub mod xplane {
    pub const ID: u32 = 1;
    pub const NAME: u32 = 2;
    pub const LINES: u32 = 3;
    /// `map<int64, XEventMetadata>`
    pub const EVENT_METADATA: u32 = 4;
    /// `map<int64, XStatMetadata>`
    pub const STAT_METADATA: u32 = 5;
    pub const STATS: u32 = 6;
}

pub mod xline {
    pub const ID: u32 = 1;
    pub const NAME: u32 = 2;
    pub const TIMESTAMP_NS: u32 = 3;
    pub const EVENTS: u32 = 4;
    pub const DURATION_PS: u32 = 9;
    pub const DISPLAY_NAME: u32 = 11;
}

pub mod xevent {
    pub const METADATA_ID: u32 = 1;
    pub const OFFSET_PS: u32 = 2;
    pub const DURATION_PS: u32 = 3;
    pub const NUM_OCCURRENCES: u32 = 5;
}

pub mod xstat {
    pub const METADATA_ID: u32 = 1;
    pub const DOUBLE_VALUE: u32 = 2;
    pub const UINT64_VALUE: u32 = 3;
    pub const INT64_VALUE: u32 = 4;
    pub const STR_VALUE: u32 = 5;
    pub const REF_VALUE: u32 = 7;
    pub const COMPRESSED_STR_VALUE: u32 = 8;
}

pub mod xevent_metadata {
    pub const NAME: u32 = 2;
    pub const DISPLAY_NAME: u32 = 4;
}

pub mod xstat_metadata {
    pub const ID: u32 = 1;
    pub const NAME: u32 = 2;
}

/// Fields of a protobuf map entry (`map<K, V>` is `repeated Entry`).
pub mod map_entry {
    pub const KEY: u32 = 1;
    pub const VALUE: u32 = 2;
}

/// The one-byte key of a field numbered below 16.
pub const fn key(field: u32, wire: u8) -> u8 {
    ((field as u8) << 3) | wire
}
