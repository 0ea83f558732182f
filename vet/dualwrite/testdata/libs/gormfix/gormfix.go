// Package gormfix: GORM writes next to an SNS publish.
package gormfix

import (
	"context"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sns"
	"gorm.io/gorm"
)

type Order struct {
	ID   int64
	Paid bool
}

// CreateThenPublish: gorm Create (autocommit), then an SNS publish.
func CreateThenPublish(ctx context.Context, db *gorm.DB, c *sns.Client) error {
	if err := db.WithContext(ctx).Create(&Order{ID: 1}).Error; err != nil {
		return err
	}
	_, err := c.Publish(ctx, &sns.PublishInput{TopicArn: aws.String("arn:orders"), Message: aws.String("{}")}) // want `dual write: CreateThenPublish publishes sns.Client.Publish after the database write \(gorm.DB.Create`
	return err
}

// PublishInTransaction: the publish runs in gorm's Transaction callback.
func PublishInTransaction(ctx context.Context, db *gorm.DB, c *sns.Client) error {
	return db.Transaction(func(tx *gorm.DB) error {
		if err := tx.Model(&Order{ID: 1}).Update("paid", true).Error; err != nil {
			return err
		}
		_, err := c.Publish(ctx, &sns.PublishInput{Message: aws.String("{}")}) // want `publishes sns.Client.Publish inside the transaction`
		return err
	})
}

// ReadThenPublish reads only: not a dual write.
func ReadThenPublish(ctx context.Context, db *gorm.DB, c *sns.Client) error {
	var o Order
	if err := db.WithContext(ctx).First(&o, 1).Error; err != nil {
		return err
	}
	_, err := c.Publish(ctx, &sns.PublishInput{Message: aws.String("{}")})
	return err
}
