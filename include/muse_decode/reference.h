// CPU references of every op: the test oracles, written for clarity and
// usable on any machine.
#pragma once

#include "muse_decode/reference/attention_block.h"
#include "muse_decode/reference/attn2.h"
#include "muse_decode/reference/o_proj.h"
#include "muse_decode/reference/qkv_front.h"
#include "muse_decode/reference/route.h"
