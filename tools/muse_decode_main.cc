// muse-decode: the main job. Runs the Muse Spark verify step's fused kernels
// (qkv_front, attn2, o_proj, route, and attention_block where it serves) on
// this GPU for a chosen deployment, over several layers' worth of random
// weights and caches; checks every op against the CPU reference and prints a
// table of time, bandwidth and the unfused path timed in the same run.
// Without a supported GPU it runs and checks the CPU reference path on a
// small shape and says why the GPU part did not run.
#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <exception>
#include <initializer_list>
#include <optional>
#include <string>
#include <vector>

#include "muse_decode/arch.h"
#include "muse_decode/route.h"
#include "verify_step.h"

namespace md = muse_decode;
using md::tool::Deployment;
using md::tool::OpResult;

namespace {

const char* kHelp = R"(usage: muse-decode [options]

Runs one Muse Spark layer's verify step (8 tokens per request) on this GPU:
qkv_front, attn2, o_proj and route, as the served step calls them, over
several layers' worth of random weights and KV caches. Checks each op against
the CPU reference, then times it by CUDA-graph replay with the L2 flushed
before each replay (each op launched with programmatic dependent launch, as
the Python package launches it), beside the unfused path (cuBLAS GEMMs plus
plain kernels) of the same inputs. The "block" row is the attention block as
a step pays it: qkv_front, attn2 and o_proj chained in one graph, each
iteration on another layer; the "attention_block" row the same step in one
launch per layer (checked against the chain's CPU reference), or the reason
it does not serve the deployment; "ops alone" adds the ops' own rows.
Without an SM90/SM100 GPU it checks the CPU reference path on a small shape
and says why the GPU part did not run. Exit status 0 when every check
passes.

options (a value follows its option, --tp 4, or joins it after '=', --tp=4):
  --tp N          tensor/expert-parallel size: 1, 2, 4 or 8 (this rank has 16/N KV
                  heads and 256/N experts; default 8)
  --context L     keys per request, the step's 8 included, 8..262144; also the
                  deployment's max_model_len (default 32768)
  --requests R    requests in the step, 1..8 (default 1)
  --layer KIND    sliding (window 2048, RoPE) or full (no window, no RoPE);
                  default sliding
  --layers N      layers (weights and KV cache) to rotate through, 1..64
                  (default: enough to exceed three times the L2; each op
                  alone also rotates its weights past three times the L2)
  --tile-n N      GEMM tile of the routing metadata: 8, 16, 32, 64, 128 or 256
                  (default 128)
  --calls N       calls per CUDA graph for qkv_front, attn2, o_proj and the
                  block's two rows, 1..1024
                  (default: the number of layers, at least 40)
  --replays N     timed replays, the median is reported, 5..101 (default 7)
  --cpu           run only the CPU reference path
  --json          one JSON object on stdout instead of the table
  --quiet         no progress lines on stderr
  -h, --help      this text
)";

[[noreturn]] void usage_error(const std::string& msg) {
  std::fprintf(stderr, "muse-decode: %s\n(see muse-decode --help)\n", msg.c_str());
  std::exit(2);
}

// The command line, one option at a time: its name and, for an option that
// takes one, its value, joined to it after '=' (--tp=4) or the next argument
// (--tp 4).
class Args {
 public:
  Args(int argc, char** argv) : argc_(argc), argv_(argv) {}
  // The next option's name; false after the last.
  bool next() {
    if (++i_ >= argc_) return false;
    name_ = argv_[i_];
    joined_.reset();
    const size_t eq = name_.find('=');
    if (name_.rfind("--", 0) == 0 && eq != std::string::npos) {
      joined_ = name_.substr(eq + 1);
      name_.resize(eq);
    }
    return true;
  }
  const std::string& name() const { return name_; }
  // The option's value, or nullptr when the command line ends without one.
  const char* value() {
    if (joined_) return joined_->c_str();
    return i_ + 1 < argc_ ? argv_[++i_] : nullptr;
  }
  // For an option that takes no value: a usage error when one is joined to it.
  void no_value() const {
    if (joined_) usage_error(name_ + " takes no value, got '" + name_ + "=" + *joined_ + "'");
  }

 private:
  int argc_;
  char** argv_;
  int i_ = 0;
  std::string name_;
  std::optional<std::string> joined_;
};

// The integer value of the current option, or a usage error that says which
// values it accepts, the same text whether the value was not a number or a
// number the option refuses.
template <typename Accepts>
int int_flag(Args& args, const std::string& accepted, Accepts&& accepts) {
  const std::string& name = args.name();
  const char* text = args.value();
  if (!text) usage_error(name + " needs a value: " + accepted);
  char* end = nullptr;
  errno = 0;
  const long v = std::strtol(text, &end, 10);
  if (*text == '\0' || *end != '\0' || errno == ERANGE || v < INT_MIN || v > INT_MAX || !accepts(static_cast<int>(v)))
    usage_error(name + " must be " + accepted + ", got '" + text + "'");
  return static_cast<int>(v);
}

// An option whose values are a range.
int range_flag(Args& args, int lo, int hi) {
  return int_flag(args, "an integer in [" + std::to_string(lo) + ", " + std::to_string(hi) + "]",
                  [&](int v) { return v >= lo && v <= hi; });
}

// An option whose values are a list.
int set_flag(Args& args, std::initializer_list<int> values) {
  std::string accepted;
  for (const int v : values) accepted += (accepted.empty() ? "one of " : ", ") + std::to_string(v);
  return int_flag(args, accepted, [&](int v) { return std::find(values.begin(), values.end(), v) != values.end(); });
}

struct Options {
  Deployment d;
  bool cpu_only = false, json = false;
};

Options parse(int argc, char** argv) {
  Options o;
  Args args(argc, argv);
  while (args.next()) {
    const std::string& a = args.name();
    if (a == "-h" || a == "--help") {
      args.no_value();
      std::fputs(kHelp, stdout);
      std::exit(0);
    } else if (a == "--tp") {
      o.d.tp = set_flag(args, {1, 2, 4, 8});
    } else if (a == "--context") {
      o.d.context = range_flag(args, 8, 262144);
    } else if (a == "--requests") {
      o.d.requests = range_flag(args, 1, 8);
    } else if (a == "--layer") {
      const char* k = args.value();
      if (!k) usage_error("--layer needs a value: one of sliding, full");
      if (std::strcmp(k, "sliding") != 0 && std::strcmp(k, "full") != 0)
        usage_error(std::string("--layer must be one of sliding, full, got '") + k + "'");
      o.d.sliding = std::strcmp(k, "sliding") == 0;
    } else if (a == "--layers") {
      o.d.layers = range_flag(args, 1, 64);
    } else if (a == "--tile-n") {
      o.d.tile_n = int_flag(args, "one of 8, 16, 32, 64, 128, 256", md::valid_tile_n);
    } else if (a == "--calls") {
      o.d.calls = range_flag(args, 1, 1024);
    } else if (a == "--replays") {
      o.d.replays = range_flag(args, 5, 101);
    } else if (a == "--cpu") {
      args.no_value();
      o.cpu_only = true;
    } else if (a == "--json") {
      args.no_value();
      o.json = true;
    } else if (a == "--quiet") {
      args.no_value();
      o.d.progress = false;
    } else {
      usage_error("unknown option '" + a + "'");
    }
  }
  return o;
}

std::string json_escape(const std::string& s) {
  std::string out;
  for (char c : s) out += (c == '"' || c == '\\') ? std::string("\\") + c : std::string(1, c);
  return out;
}

// A row's check: pass, FAIL, or skip (not run, and not a failure: an op
// whose check refuses the deployment).
const char* check_word(const OpResult& r) {
  if (!r.pass) return "FAIL";
  return r.skipped.empty() ? "pass" : "skip";
}

// The two rows of the attention block (the three ops chained, and
// attention_block's one launch) time the ops of their own rows again.
bool is_block(const OpResult& r) { return r.op == "block" || r.op == "attention_block"; }

void print_rows(const char* title, const std::vector<OpResult>& rows, bool timed) {
  std::printf("%s\n", title);
  if (timed) {
    std::printf("  %-15s %-5s %10s %9s %8s %10s %8s %12s %9s\n", "op", "check", "us/call", "GB/s", "% copy",
                "floor us", "x floor", "unfused us", "speed-up");
    double sum = 0, sum_unfused = 0;
    for (const auto& r : rows) {
      if (!r.skipped.empty()) {  // the reason in place of the numbers
        std::printf("  %-15s %-5s not run: %s\n", r.op.c_str(), check_word(r), r.skipped.c_str());
        continue;
      }
      std::printf("  %-15s %-5s %10.2f %9.0f %8.1f %10.2f %7.2fx %12.2f %8.1fx\n", r.op.c_str(), check_word(r), r.us,
                  r.bytes / r.us * 1e-3, 100.0 * r.floor_us / r.us, r.floor_us, r.us / r.floor_us, r.unfused_us,
                  r.unfused_us / r.us);
      if (is_block(r)) continue;
      sum += r.us;
      sum_unfused += r.unfused_us;
    }
    // The ops each alone, added: what the step costs without the block's overlap.
    std::printf("  %-15s %-5s %10.2f %9s %8s %10s %8s %12.2f %8.1fx\n", "ops alone", "", sum, "", "", "", "",
                sum_unfused, sum_unfused / sum);
  }
  for (const auto& r : rows) std::printf("  %s %s: %s\n", r.op.c_str(), check_word(r), r.detail.c_str());
}

}  // namespace

int main(int argc, char** argv) {
  const Options o = parse(argc, argv);
  const bool gpu = !o.cpu_only && md::supported_family(md::gpu_family());
  std::vector<OpResult> cpu = md::tool::run_cpu(), gpu_rows;
  std::string gpu_error;
#ifdef MUSE_DECODE_WITH_CUDA
  if (gpu) {
    try {
      gpu_rows = md::tool::run_gpu(o.d);
    } catch (const std::exception& e) {
      gpu_error = e.what();
    }
  }
#endif
  const std::string why = o.cpu_only ? "--cpu was given"
                                     : "the GPU part needs an SM90 (H100/H200) or SM100 (B200/B300) GPU; this machine has: " +
                                           md::describe_device();
  bool pass = gpu_error.empty();
  for (const auto& r : cpu) pass &= r.pass;
  for (const auto& r : gpu_rows) pass &= r.pass;
  const Deployment& d = o.d;
  if (o.json) {
    char date[32];
    const std::time_t now = std::time(nullptr);
    std::strftime(date, sizeof date, "%Y-%m-%d %H:%M UTC", std::gmtime(&now));
    std::printf("{\"date\": \"%s\", \"device\": \"%s\", \"tp\": %d, \"context\": %d, \"requests\": %d, \"layer\": \"%s\", \"pass\": %s,\n",
                date, json_escape(md::describe_device()).c_str(), d.tp, d.context, d.requests, d.sliding ? "sliding" : "full",
                pass ? "true" : "false");
    std::printf(" \"cpu\": [");
    for (size_t i = 0; i < cpu.size(); ++i)
      std::printf("%s{\"op\": \"%s\", \"check\": \"%s\", \"detail\": \"%s\"}", i ? ", " : "", cpu[i].op.c_str(),
                  check_word(cpu[i]), json_escape(cpu[i].detail).c_str());
    std::printf("],\n \"gpu\": [");
    for (size_t i = 0; i < gpu_rows.size(); ++i) {
      const auto& r = gpu_rows[i];
      std::printf("%s{\"op\": \"%s\", \"check\": \"%s\", \"detail\": \"%s\"", i ? ", " : "", r.op.c_str(),
                  check_word(r), json_escape(r.detail).c_str());
      if (!r.skipped.empty()) {  // no numbers: the reason
        std::printf(", \"skipped\": \"%s\"}", json_escape(r.skipped).c_str());
        continue;
      }
      std::printf(", \"us_per_call\": %.3f, \"gb_per_s\": %.1f, \"pct_of_copy_bw\": %.1f, \"floor_us\": %.3f, "
                  "\"x_floor\": %.3f, \"unfused_us\": %.3f, \"speedup\": %.2f}",
                  r.us, r.bytes / r.us * 1e-3, 100.0 * r.floor_us / r.us, r.floor_us, r.us / r.floor_us, r.unfused_us,
                  r.unfused_us / r.us);
    }
    std::printf("],\n \"gpu_skipped\": \"%s\"}\n", gpu ? json_escape(gpu_error).c_str() : json_escape(why).c_str());
    return pass ? 0 : 1;
  }
  char title[300];
  if (gpu && gpu_error.empty()) {
    std::snprintf(title, sizeof title, "muse-decode on %s: TP%d, %d KV heads, %d request(s) x 8 tokens, context %d, %s layer",
                  md::describe_device().c_str(), d.tp, 16 / d.tp, d.requests, d.context,
                  d.sliding ? "sliding (window 2048, RoPE)" : "full (no RoPE)");
    print_rows(title, gpu_rows, true);
  }
  print_rows("CPU reference path (small shapes):", cpu, false);
  if (!gpu) std::printf("GPU part not run: %s\n", why.c_str());
  if (!gpu_error.empty()) std::printf("GPU part failed: %s\n", gpu_error.c_str());
  return pass ? 0 : 1;
}
