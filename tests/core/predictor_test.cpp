#include <gtest/gtest.h>

#include <cmath>

#include "core/predictor.hpp"

namespace pipefill {
namespace {

TEST(Predictor, UnknownClassIsNotReady) {
  BubblePredictor p(2);
  const BubblePrediction r = p.predict("#0", 0.1);
  EXPECT_EQ(r.count, 0u);
  EXPECT_FALSE(r.ready);
  EXPECT_EQ(p.class_count(), 0u);
}

TEST(Predictor, CountEwmaMinMaxAndReadiness) {
  BubblePredictor p(/*min_samples=*/3, /*window=*/64, /*alpha=*/0.5);
  p.add_sample("#1", 100.0);
  EXPECT_FALSE(p.predict("#1", 0.5).ready);
  EXPECT_DOUBLE_EQ(p.predict("#1", 0.5).ewma_us, 100.0);
  p.add_sample("#1", 200.0);
  EXPECT_DOUBLE_EQ(p.predict("#1", 0.5).ewma_us, 150.0);
  EXPECT_FALSE(p.predict("#1", 0.5).ready);
  p.add_sample("#1", 50.0);
  const BubblePrediction r = p.predict("#1", 0.5);
  EXPECT_TRUE(r.ready);
  EXPECT_EQ(r.count, 3u);
  EXPECT_DOUBLE_EQ(r.ewma_us, 100.0);  // 0.5*50 + 0.5*150
  EXPECT_DOUBLE_EQ(r.min_us, 50.0);
  EXPECT_DOUBLE_EQ(r.max_us, 200.0);
}

TEST(Predictor, NearestRankQuantile) {
  BubblePredictor p(1);
  for (double v : {50.0, 10.0, 40.0, 20.0, 30.0, 60.0, 70.0, 80.0, 90.0, 100.0}) {
    p.add_sample("k", v);
  }
  EXPECT_DOUBLE_EQ(p.predict("k", 0.1).quantile_us, 10.0);   // rank 1
  EXPECT_DOUBLE_EQ(p.predict("k", 0.15).quantile_us, 20.0);  // rank ceil(1.5)=2
  EXPECT_DOUBLE_EQ(p.predict("k", 0.5).quantile_us, 50.0);   // rank 5
  EXPECT_DOUBLE_EQ(p.predict("k", 0.91).quantile_us, 100.0); // rank 10
  EXPECT_DOUBLE_EQ(p.predict("k", 1.0).quantile_us, 100.0);
}

TEST(Predictor, WindowDropsOldSamplesForQuantileButNotMinMax) {
  BubblePredictor p(1, /*window=*/3);
  p.add_sample("k", 1.0);
  p.add_sample("k", 500.0);
  p.add_sample("k", 600.0);
  p.add_sample("k", 700.0);
  const BubblePrediction r = p.predict("k", 0.1);
  EXPECT_DOUBLE_EQ(r.quantile_us, 500.0);  // 1.0 left the window
  EXPECT_DOUBLE_EQ(r.min_us, 1.0);
  EXPECT_EQ(r.count, 4u);
}

TEST(Predictor, ClassesAreIndependent) {
  BubblePredictor p(1);
  p.add_sample("#0", 10.0);
  p.add_sample("#1", 99.0);
  EXPECT_EQ(p.class_count(), 2u);
  EXPECT_DOUBLE_EQ(p.predict("#0", 1.0).quantile_us, 10.0);
  EXPECT_DOUBLE_EQ(p.predict("#1", 1.0).quantile_us, 99.0);
}

TEST(Predictor, MinSamplesZeroIsReadyAfterOneSample) {
  BubblePredictor p(0);
  EXPECT_FALSE(p.predict("k", 0.5).ready);  // no data at all
  p.add_sample("k", 5.0);
  EXPECT_TRUE(p.predict("k", 0.5).ready);
}

TEST(Predictor, NonFiniteSamplesAreIgnored) {
  BubblePredictor p(1);
  p.add_sample("k", 30.0);
  p.add_sample("k", std::nan(""));
  p.add_sample("k", 10.0);
  const BubblePrediction r = p.predict("k", 0.5);
  EXPECT_EQ(r.count, 2u);
  EXPECT_DOUBLE_EQ(r.quantile_us, 10.0);
  EXPECT_DOUBLE_EQ(p.predict("k", 1.0).quantile_us, 30.0);
}

TEST(Predictor, ClassKeyLabelWins) {
  EXPECT_EQ(bubble_class_key(3, nullptr), "#3");
  EXPECT_EQ(bubble_class_key(3, ""), "#3");
  EXPECT_EQ(bubble_class_key(3, "warmup-recv"), "warmup-recv");
}

}  // namespace
}  // namespace pipefill
