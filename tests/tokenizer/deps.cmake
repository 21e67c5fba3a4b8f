# The real DeepSeek-V4 tokenizer.json is committed zstd-compressed
# (tests/data/tokenizer/*.zst); the tests decompress it with libzstd.
pkg_check_modules(ZSTD REQUIRED IMPORTED_TARGET libzstd)
target_link_libraries(test_${area} PRIVATE PkgConfig::ZSTD)
