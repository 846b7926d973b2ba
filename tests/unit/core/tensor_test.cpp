#include <gtest/gtest.h>

#include "core/error.h"
#include "core/tensor.h"

using namespace ms;

TEST(Tensor, EmptyIsContiguousAndAligned) {
  Tensor t = Tensor::empty({3, 4, 5}, DType::BF16);
  EXPECT_EQ(t.numel(), 60);
  EXPECT_EQ(t.nbytes(), 120u);
  EXPECT_EQ(t.strides(), (Shape{20, 5, 1}));
  EXPECT_TRUE(t.is_contiguous());
  EXPECT_EQ(reinterpret_cast<uintptr_t>(t.raw()) % 64, 0u);
}

TEST(Tensor, SliceSelectViewShareStorage) {
  Tensor t = Tensor::zeros({4, 6}, DType::F32);
  for (int i = 0; i < 24; ++i) t.data<float>()[i] = static_cast<float>(i);
  Tensor row = t.select(0, 2);
  EXPECT_EQ(row.shape(), (Shape{6}));
  EXPECT_EQ(row.data<float>()[0], 12.0f);
  Tensor cols = t.slice(1, 2, 4);
  EXPECT_FALSE(cols.is_contiguous());
  Tensor c = cols.clone();
  EXPECT_TRUE(c.is_contiguous());
  EXPECT_EQ(c.data<float>()[0], 2.0f);
  EXPECT_EQ(c.data<float>()[1], 3.0f);
  EXPECT_EQ(c.data<float>()[2], 8.0f);
  Tensor v = t.view({2, -1});
  EXPECT_EQ(v.shape(), (Shape{2, 12}));
  v.data<float>()[0] = 42.0f;
  EXPECT_EQ(t.data<float>()[0], 42.0f);
}

TEST(Tensor, BadViewsThrowWithLocation) {
  Tensor t = Tensor::zeros({4, 6}, DType::F32);
  EXPECT_THROW(t.view({5, 5}), Error);
  EXPECT_THROW(t.slice(1, 3, 9), Error);
  EXPECT_THROW(t.size(3), Error);
  try {
    t.view({7, -1});
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("tensor.cpp"), std::string::npos);
  }
}

TEST(Tensor, Nvfp4IsPacked) {
  Tensor t = Tensor::empty({8, 32}, DType::NVFP4);
  EXPECT_EQ(t.nbytes(), 128u);
  EXPECT_THROW(Tensor::empty({3}, DType::NVFP4), Error);
}

TEST(DType, NamesRoundTrip) {
  for (DType t : {DType::F32, DType::F16, DType::BF16, DType::F8_E4M3, DType::F8_E5M2, DType::NVFP4,
                  DType::U8, DType::I32, DType::I64}) {
    EXPECT_EQ(dtype_from_name(dtype_name(t)), t);
  }
  EXPECT_EQ(dtype_from_name("F8_E4M3"), DType::F8_E4M3);
  EXPECT_FALSE(dtype_from_name("F4").has_value());
}
