//! gpreempt-sim: the emulated AMD GPU (KFD) used by the tests and the demo. Not written yet: see
//! the emulator milestone (DESIGN.md, "The emulator").
