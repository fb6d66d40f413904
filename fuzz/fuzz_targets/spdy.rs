#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    vk_sandbox_fuzz::check_spdy(data);
});
