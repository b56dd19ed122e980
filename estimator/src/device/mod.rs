//! Device (GPU) clock snapshot pairs and their fitter; the device-clock issue fills this.
