//! Which public types cross threads, checked at compile time (a field that stops being
//! `Send` or `Sync` fails the build here, not in a user's program).

/// Compiles only for `T: Send + Sync`.
const fn send_and_sync<T: Send + Sync>() {}

/// Compiles only for `T: Send`.
const fn send<T: Send>() {}

const _: () = {
    send_and_sync::<crate::Comm>();
    send_and_sync::<crate::CpuComm>();
    send_and_sync::<crate::CommConfig>();
    send_and_sync::<crate::CpuConfig>();
    send_and_sync::<crate::Id>();
    send_and_sync::<crate::Error>();
    send_and_sync::<crate::SymmetricBuffer<f32>>();
    send_and_sync::<crate::CpuSymmetricBuffer<f32>>();
    send::<crate::Group<'static>>();
};
