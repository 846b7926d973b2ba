// Rank, world and rank 0's address from each launcher's environment, their precedence, and errors that name
// the variable or flag at fault.
#include "dist/rank_info.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <map>

#include "core/error.h"

namespace ms::dist {
namespace {

using ::testing::HasSubstr;
using Env = std::map<std::string, std::string>;

EnvLookup lookup(const Env& env) {
  return [env](const std::string& name) -> std::optional<std::string> {
    auto it = env.find(name);
    if (it == env.end()) return std::nullopt;
    return it->second;
  };
}

DistFlags world(int n) {
  DistFlags f;
  f.world_size = n;
  return f;
}

template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.message();
  }
  return "no error";
}

std::string resolve_error(const DistFlags& flags, const Env& env) {
  return error_of([&] { resolve_rank_info(flags, lookup(env)); });
}

const Env kTorchrun = {{"RANK", "3"},
                       {"WORLD_SIZE", "4"},
                       {"LOCAL_RANK", "1"},
                       {"LOCAL_WORLD_SIZE", "2"},
                       {"MASTER_ADDR", "node0"},
                       {"MASTER_PORT", "29500"},
                       {"GROUP_RANK", "1"}};
const Env kMpirun = {{"OMPI_COMM_WORLD_RANK", "2"},
                     {"OMPI_COMM_WORLD_SIZE", "4"},
                     {"OMPI_COMM_WORLD_LOCAL_RANK", "2"},
                     {"OMPI_COMM_WORLD_LOCAL_SIZE", "4"}};
const Env kSlurm = {{"SLURM_PROCID", "5"},
                    {"SLURM_NTASKS", "8"},
                    {"SLURM_LOCALID", "1"},
                    {"SLURM_NODEID", "1"},
                    {"SLURM_NNODES", "2"}};

Env merged(std::initializer_list<Env> envs) {
  Env out;
  for (auto& e : envs) out.insert(e.begin(), e.end());
  return out;
}

TEST(RankInfo, NoLauncherIsASingleProcess) {
  RankInfo r = resolve_rank_info(world(1), lookup({}));
  EXPECT_EQ(r.launcher, Launcher::Self);
  EXPECT_EQ(r.rank, 0);
  EXPECT_EQ(r.world_size, 1);
  EXPECT_FALSE(r.must_launch_local());
}

TEST(RankInfo, SelfLaunchOnOneNode) {
  RankInfo r = resolve_rank_info(world(4), lookup({}));
  EXPECT_EQ(r.launcher, Launcher::Self);
  EXPECT_EQ(r.rank, 0);
  EXPECT_EQ(r.world_size, 4);
  EXPECT_EQ(r.local_world_size, 4);
  EXPECT_EQ(r.nnodes, 1);
  EXPECT_EQ(r.master_addr, "127.0.0.1");
  EXPECT_EQ(r.master_port, 0);  // chosen by the launching process
  EXPECT_TRUE(r.must_launch_local());
}

TEST(RankInfo, SelfLaunchAcrossNodes) {
  DistFlags f = world(16);
  f.nnodes = 2;
  f.node_rank = 1;
  f.dist_init_addr = "10.0.0.7:5000";
  RankInfo r = resolve_rank_info(f, lookup({}));
  EXPECT_EQ(r.rank, 8);
  EXPECT_EQ(r.local_rank, 0);
  EXPECT_EQ(r.local_world_size, 8);
  EXPECT_EQ(r.node_rank, 1);
  EXPECT_EQ(r.nnodes, 2);
  EXPECT_EQ(r.init_addr(), "10.0.0.7:5000");
  EXPECT_TRUE(r.must_launch_local());

  f.dist_init_addr.clear();
  EXPECT_THAT(resolve_error(f, {}), HasSubstr("--dist-init-addr"));
  f.dist_init_addr = "10.0.0.7:5000";
  f.world_size = 6;
  f.nnodes = 4;
  EXPECT_THAT(resolve_error(f, {}), HasSubstr("not a multiple of --nnodes 4"));
  f.world_size = 8;
  f.node_rank = 4;
  EXPECT_THAT(resolve_error(f, {}), HasSubstr("--node-rank 4"));
}

TEST(RankInfo, Torchrun) {
  RankInfo r = resolve_rank_info(world(4), lookup(kTorchrun));
  EXPECT_EQ(r.launcher, Launcher::Torchrun);
  EXPECT_EQ(r.rank, 3);
  EXPECT_EQ(r.world_size, 4);
  EXPECT_EQ(r.local_rank, 1);
  EXPECT_EQ(r.local_world_size, 2);
  EXPECT_EQ(r.node_rank, 1);
  EXPECT_EQ(r.nnodes, 2);
  EXPECT_EQ(r.master_addr, "node0");
  EXPECT_EQ(r.master_port, 29501);  // torchrun's store holds MASTER_PORT
  EXPECT_FALSE(r.must_launch_local());
  DistFlags f = world(4);
  f.dist_init_addr = "node3:7000";
  EXPECT_EQ(resolve_rank_info(f, lookup(kTorchrun)).init_addr(), "node3:7000");
}

TEST(RankInfo, Mpirun) {
  RankInfo r = resolve_rank_info(world(4), lookup(kMpirun));
  EXPECT_EQ(r.launcher, Launcher::Mpirun);
  EXPECT_EQ(r.rank, 2);
  EXPECT_EQ(r.local_rank, 2);
  EXPECT_EQ(r.nnodes, 1);
  EXPECT_EQ(r.master_addr, "127.0.0.1");
  EXPECT_GT(r.master_port, 0);  // a fixed default all ranks agree on
  Env two_nodes = kMpirun;
  two_nodes["OMPI_COMM_WORLD_LOCAL_SIZE"] = "2";
  two_nodes["OMPI_COMM_WORLD_LOCAL_RANK"] = "0";
  EXPECT_THAT(resolve_error(world(4), two_nodes), HasSubstr("--dist-init-addr host:port"));
  DistFlags f = world(4);
  f.dist_init_addr = "[fe80::1]:6000";
  r = resolve_rank_info(f, lookup(two_nodes));
  EXPECT_EQ(r.node_rank, 1);
  EXPECT_EQ(r.nnodes, 2);
  EXPECT_EQ(r.master_addr, "fe80::1");
  EXPECT_EQ(r.init_addr(), "[fe80::1]:6000");
}

TEST(RankInfo, Slurm) {
  DistFlags f = world(8);
  f.dist_init_addr = "gpu-a:6000";
  RankInfo r = resolve_rank_info(f, lookup(kSlurm));
  EXPECT_EQ(r.launcher, Launcher::Slurm);
  EXPECT_EQ(r.rank, 5);
  EXPECT_EQ(r.world_size, 8);
  EXPECT_EQ(r.local_rank, 1);
  EXPECT_EQ(r.local_world_size, 4);
  EXPECT_EQ(r.node_rank, 1);
  EXPECT_EQ(r.nnodes, 2);
  EXPECT_THAT(resolve_error(world(8), kSlurm), HasSubstr("--dist-init-addr"));
  Env odd = kSlurm;
  odd["SLURM_NNODES"] = "3";
  EXPECT_THAT(resolve_error(f, odd), HasSubstr("SLURM_NTASKS=8 is not a multiple of SLURM_NNODES=3"));
}

TEST(RankInfo, MoeserveLauncherVariablesComeFirst) {
  // Children of moeserve's own launcher inherit whatever launcher started their parent.
  Env env = merged({{{"MOESERVE_RANK", "1"},
                     {"MOESERVE_WORLD_SIZE", "2"},
                     {"MOESERVE_LOCAL_RANK", "1"},
                     {"MOESERVE_LOCAL_WORLD_SIZE", "2"},
                     {"MOESERVE_DIST_INIT_ADDR", "127.0.0.1:40000"}},
                    kSlurm});
  RankInfo r = resolve_rank_info(world(2), lookup(env));
  EXPECT_EQ(r.launcher, Launcher::Moeserve);
  EXPECT_EQ(r.rank, 1);
  EXPECT_EQ(r.local_rank, 1);
  EXPECT_EQ(r.init_addr(), "127.0.0.1:40000");
  env.erase("MOESERVE_DIST_INIT_ADDR");
  EXPECT_THAT(resolve_error(world(2), env), HasSubstr("MOESERVE_DIST_INIT_ADDR is not set"));
}

TEST(RankInfo, TorchrunBeforeMpirunBeforeSlurm) {
  DistFlags f = world(4);
  f.dist_init_addr = "h:1";
  EXPECT_EQ(resolve_rank_info(f, lookup(merged({kTorchrun, kMpirun, kSlurm}))).launcher, Launcher::Torchrun);
  EXPECT_EQ(resolve_rank_info(f, lookup(merged({kMpirun, kSlurm}))).launcher, Launcher::Mpirun);
  f.world_size = 8;
  EXPECT_EQ(resolve_rank_info(f, lookup(kSlurm)).launcher, Launcher::Slurm);
}

TEST(RankInfo, BadValuesAreNamed) {
  auto with = [](Env env, const std::string& k, const std::string& v) {
    env[k] = v;
    return env;
  };
  EXPECT_EQ(resolve_error(world(4), with(kTorchrun, "RANK", "abc")), "RANK='abc' is not an integer");
  EXPECT_EQ(resolve_error(world(4), with(kTorchrun, "RANK", "4")), "RANK=4 is not below WORLD_SIZE=4");
  EXPECT_EQ(resolve_error(world(4), with(kTorchrun, "LOCAL_RANK", "2")),
            "LOCAL_RANK=2 is not below LOCAL_WORLD_SIZE=2");
  EXPECT_EQ(resolve_error(world(4), with(kTorchrun, "MASTER_PORT", "x1")),
            "MASTER_PORT='x1' is not an integer");
  Env no_local = kTorchrun;
  no_local.erase("LOCAL_RANK");
  EXPECT_THAT(resolve_error(world(4), no_local), HasSubstr("LOCAL_RANK is not set"));
  Env no_master = kTorchrun;
  no_master.erase("MASTER_ADDR");
  EXPECT_THAT(resolve_error(world(4), no_master), HasSubstr("MASTER_ADDR is not set"));
  EXPECT_EQ(resolve_error(world(2), kTorchrun),
            "WORLD_SIZE=4 (torchrun) but --tp-size/--ep-size ask for 2 ranks");
  EXPECT_EQ(resolve_error(world(4), with(kMpirun, "OMPI_COMM_WORLD_LOCAL_RANK", "-1")),
            "OMPI_COMM_WORLD_LOCAL_RANK=-1 must be at least 0");
  EXPECT_EQ(resolve_error(world(4), with(kMpirun, "OMPI_COMM_WORLD_SIZE", "4x")),
            "OMPI_COMM_WORLD_SIZE='4x' is not an integer");
  EXPECT_EQ(resolve_error(world(8), with(kSlurm, "SLURM_NODEID", "2")),
            "SLURM_NODEID=2 is not below SLURM_NNODES=2");
  DistFlags f = world(4);
  f.dist_init_addr = "nohost";
  EXPECT_EQ(resolve_error(f, kTorchrun), "--dist-init-addr='nohost' is not host:port");
  f.dist_init_addr = "h:70000";
  EXPECT_EQ(resolve_error(f, kTorchrun), "--dist-init-addr='h:70000': port 70000 is not in 1..65535");
  f.dist_init_addr = "h:1";
  f.nnodes = 4;
  EXPECT_THAT(resolve_error(f, kTorchrun), HasSubstr("--nnodes 4 but torchrun started 2 nodes"));
}

TEST(RankInfo, NodeFlagsUnderALauncherMustAgreeWithIt) {
  DistFlags f = world(4);
  f.dist_init_addr = "h:1";
  f.nnodes = 2;
  f.node_rank = 1;  // kTorchrun: rank 3 of 4, 2 per node
  RankInfo r = resolve_rank_info(f, lookup(kTorchrun));
  EXPECT_EQ(r.launcher, Launcher::Torchrun);
  EXPECT_EQ(r.node_rank, 1);
  f.node_rank = 0;
  EXPECT_EQ(resolve_error(f, kTorchrun),
            "--node-rank 0 but torchrun put this process on node 1 (RANK=3, LOCAL_WORLD_SIZE=2); under a "
            "launcher its variables win: drop --node-rank or make it agree");
  f.nnodes = 1;  // given, not the default: a launcher across 2 nodes contradicts it
  f.node_rank.reset();
  EXPECT_THAT(resolve_error(f, kTorchrun), HasSubstr("--nnodes 1 but torchrun started 2 nodes"));
  f.world_size = 8;
  f.nnodes.reset();
  f.node_rank = 0;
  EXPECT_THAT(resolve_error(f, kSlurm), HasSubstr("--node-rank 0 but srun put this process on node 1"));
}

TEST(RankInfo, RanksAreNamedWithTheirNodeAcrossNodes) {
  DistFlags f = world(8);
  f.nnodes = 2;
  f.node_rank = 1;
  f.dist_init_addr = "h:1";
  const RankInfo r = resolve_rank_info(f, lookup({}));
  EXPECT_EQ(r.rank, 4);
  EXPECT_EQ(r.rank_name(5), "rank 5 (node 1)");
  EXPECT_EQ(r.ranks_named({4, 5, 6, 7}), "ranks 4, 5, 6, 7 (node 1)");
  EXPECT_EQ(r.ranks_named({3, 4}), "ranks 3, 4 (nodes 0, 1)");
  const RankInfo one = resolve_rank_info(world(4), lookup({}));
  EXPECT_EQ(one.rank_name(3), "rank 3");
  EXPECT_EQ(one.ranks_named({1, 3}), "ranks 1, 3");
  EXPECT_EQ(one.ranks_named({2}), "rank 2");
}

}  // namespace
}  // namespace ms::dist
