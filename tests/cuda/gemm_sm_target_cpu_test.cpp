// The opaque GEMM item's cuBLAS handles sized to the fill partition (issue 33 item 1), with a
// recording fake cuBLAS: cublasSetSmCountTarget(fill SMs) on every handle, after cublasSetStream
// and the workspace (cublasSetStream resets the workspace, not the target), every status checked.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "common/error.hpp"
#include "cublas_api.hpp"
#include "opaque_gemm.hpp"

namespace pipefill::cuda {
namespace {

std::vector<std::string> cublas_calls;
cublasStatus_t target_status = CUBLAS_STATUS_SUCCESS;

cublasStatus_t fake_set_stream(cublasHandle_t, cudaStream_t) {
  cublas_calls.push_back("cublasSetStream");
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t fake_set_workspace(cublasHandle_t, void*, size_t bytes) {
  cublas_calls.push_back("cublasSetWorkspace " + std::to_string(bytes));
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t fake_set_sm_count_target(cublasHandle_t, int sms) {
  cublas_calls.push_back("cublasSetSmCountTarget " + std::to_string(sms));
  return target_status;
}
const char* fake_status_name(cublasStatus_t status) {
  return status == CUBLAS_STATUS_NOT_SUPPORTED ? "CUBLAS_STATUS_NOT_SUPPORTED" : "other";
}

class GemmHandle : public ::testing::Test {
 protected:
  void SetUp() override {
    cublas_calls.clear();
    target_status = CUBLAS_STATUS_SUCCESS;
    api_.cublasSetStream = &fake_set_stream;
    api_.cublasSetWorkspace = &fake_set_workspace;
    api_.cublasSetSmCountTarget = &fake_set_sm_count_target;
    api_.cublasGetStatusName = &fake_status_name;
    desc_.workspace = reinterpret_cast<void*>(0x100);
    desc_.workspace_bytes = 4 << 20;
    desc_.sm_count_target = 116;  // a 132-SM H100 with 16 SMs reserved
  }
  CublasApi api_;
  GemmItemDesc desc_;
  void* handle_ = reinterpret_cast<void*>(0x1);
  void* stream_ = reinterpret_cast<void*>(0x2);
};

TEST_F(GemmHandle, TheTargetIsSetAfterTheStreamAndWorkspace) {
  ASSERT_EQ(configure_gemm_handle(api_, handle_, stream_, desc_), pfSuccess) << last_error_message();
  EXPECT_EQ(cublas_calls, (std::vector<std::string>{"cublasSetStream", "cublasSetWorkspace 4194304",
                                                    "cublasSetSmCountTarget 116"}));
}

TEST_F(GemmHandle, NoTargetKeepsCublasDefault) {
  desc_.sm_count_target = 0;
  ASSERT_EQ(configure_gemm_handle(api_, handle_, stream_, desc_), pfSuccess);
  EXPECT_EQ(cublas_calls, (std::vector<std::string>{"cublasSetStream", "cublasSetWorkspace 4194304"}));
}

TEST_F(GemmHandle, ARefusedTargetFailsNamingTheCallAndStatus) {
  target_status = CUBLAS_STATUS_NOT_SUPPORTED;
  EXPECT_EQ(configure_gemm_handle(api_, handle_, stream_, desc_), pfErrorCudaFailure);
  EXPECT_EQ(last_error_message(), "cublasSetSmCountTarget(116) failed: CUBLAS_STATUS_NOT_SUPPORTED");
}

TEST_F(GemmHandle, ANegativeTargetIsRefusedBeforeAnyCublasCall) {
  desc_.sm_count_target = -4;
  desc_.m = desc_.n = desc_.k = 4;
  float matrix[1];
  desc_.a = desc_.b = matrix;
  desc_.c = matrix;
  std::unique_ptr<GemmItem> item;
  EXPECT_EQ(make_gemm_item(desc_, stream_, &item), pfErrorInvalidArgument);
  EXPECT_EQ(last_error_message(), "make_gemm_item: sm_count_target=-4 must be >= 0 (0: cuBLAS's default)");
  EXPECT_TRUE(cublas_calls.empty());
  EXPECT_EQ(item, nullptr);
}

}  // namespace
}  // namespace pipefill::cuda
