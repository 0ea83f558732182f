// Fixture module for the dualwrite analyzer's library matchers: GORM, sqlx,
// segmentio/kafka-go and the AWS SDK v2 SNS client, the real libraries from
// the module cache (TestLibraries loads it with GOPROXY=off). It imports
// nothing of Ferry, so it keeps its own requirements and checksums.
module example.com/libs

go 1.26.0

require (
	github.com/aws/aws-sdk-go-v2 v1.48.0
	github.com/aws/aws-sdk-go-v2/service/sns v1.48.0
	github.com/jmoiron/sqlx v1.4.0
	github.com/segmentio/kafka-go v0.4.51
	gorm.io/gorm v1.31.2
)

require (
	github.com/aws/aws-sdk-go-v2/internal/configsources v1.5.12 // indirect
	github.com/aws/aws-sdk-go-v2/internal/endpoints/v2 v2.8.12 // indirect
	github.com/aws/smithy-go v1.28.9 // indirect
	github.com/jinzhu/inflection v1.0.0 // indirect
	github.com/jinzhu/now v1.1.5 // indirect
	github.com/klauspost/compress v1.15.9 // indirect
	github.com/pierrec/lz4/v4 v4.1.15 // indirect
	golang.org/x/text v0.23.0 // indirect
)
