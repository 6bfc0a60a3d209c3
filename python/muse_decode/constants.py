"""Model constants the kernels hard-wire (mirrors include/muse_decode/constants.h)."""

HIDDEN_SIZE = 8192
HEAD_DIM = 64
HEADS_PER_KV_HEAD = 8
QUERY_LEN = 8  # verify rows per request: 1 + 7 draft tokens
PAGE_SIZE = 16
NUM_EXPERTS = 256
TOP_K = 8
ROUTING_MAX_TOKENS = 8
DIVISION_EPS = 1e-15
ROUTER_OUTPUT_MULTIPLIER = 2.0**-2.5
SM_SCALE = 0.6841258107984375  # 64^-0.5 * 5.4730064863875
RMS_NORM_EPS = 1e-5
