//! GPU device clock sources; the device-clock issue fills this.
